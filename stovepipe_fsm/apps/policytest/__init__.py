"""``stovepipe-fsm test``: the timelines of a policy, with their expectations, as a suite."""
