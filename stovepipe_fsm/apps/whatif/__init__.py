"""``stovepipe-fsm whatif``: one timeline under two policies or more, compared
(docs/whatif.md)."""
