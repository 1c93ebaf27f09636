"""``stovepipe-fsm whatif``: one timeline under two policies, compared (docs/whatif.md)."""
