"""A bounded least-recently-used cache of definitive ancestry answers.

Whether one commit is an ancestor of another never changes once both exist (commits
are immutable), so a ``True``/``False`` answer can be reused forever; the bound only
caps memory. Errors are never cached: "not found" may stop being true after a fetch,
and a transient failure says nothing about the commits.
"""

from __future__ import annotations

from collections import OrderedDict


class AncestryCache:
    """LRU of ``(ancestor, descendant) → bool`` holding at most ``capacity`` answers."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._answers: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def get(self, ancestor: str, descendant: str) -> bool | None:
        key = (ancestor.lower(), descendant.lower())
        answer = self._answers.get(key)
        if answer is None:
            self.misses += 1
            return None
        self._answers.move_to_end(key)
        self.hits += 1
        return answer

    def put(self, ancestor: str, descendant: str, answer: bool) -> None:
        if self._capacity == 0:
            return
        key = (ancestor.lower(), descendant.lower())
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self._capacity:
            self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)
