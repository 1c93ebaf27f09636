"""Publisher port: the topics process writes to.

Every publish carries a dedup id (the request id for build and process messages, the
event id for hooks); a re-publish with the same id must be harmless downstream.
"""

from __future__ import annotations

from typing import Protocol

from ..domain.hooks import HookEvent


class Publisher(Protocol):
    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        """Hand ``request_id`` to ``queue``'s process consumer. ``partition``: the one the
        queue's row names (a broker may carry queues on several process streams)."""
        ...

    async def publish_build(self, queue: str, request_id: str) -> None: ...

    async def publish_hook(self, event: HookEvent) -> None: ...
