"""``Publisher`` on JetStream (see ``ports/publisher.py``).

Every publish waits for the stream's ack, so "published" means "stored"; and every
publish carries a ``Nats-Msg-Id`` so that a retry after a lost ack is dropped by the
stream's duplicate window instead of stored twice:

- process: msg id = the request id. It only dedupes *accidental* double publishes inside
  the duplicate window (a retry after a lost ack). Ingest may re-publish an existing
  request to heal a publish it lost: if the first one never landed, there is nothing to
  collide with and the re-publish is stored; if it did land, the copy is dropped, or, after
  the window, delivered and found already done (process is idempotent per request).
- build: msg id = the request id; payload names queue and request only.
- hook: msg id = the event id (derived from the admit transition, so a re-announce of
  one admission dedupes); payload = the event envelope.

Broker failures become ``Retryable``: the delivery that published is redelivered and
publishes again, which the msg id makes harmless.
"""

from __future__ import annotations

import json

from nats.js import JetStreamContext, api

from ...domain.hooks import HookEvent
from .codec import WorkMessage, encode_work
from .errors import translated
from .topology import Topology

MSG_ID_HEADER = api.Header.MSG_ID.value


class JetStreamPublisher:
    def __init__(self, js: JetStreamContext, topology: Topology, *, timeout: float = 5.0) -> None:
        self._js = js
        self._topology = topology
        self._timeout = timeout

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        await self._publish(
            self._topology.process_subject(queue, partition),
            encode_work(WorkMessage(queue=queue, request_id=request_id)),
            msg_id=request_id,
            stream=self._topology.process_stream_of(partition),
        )

    async def publish_build(self, queue: str, request_id: str) -> None:
        await self._publish(
            self._topology.build_subject(queue),
            encode_work(WorkMessage(queue=queue, request_id=request_id)),
            msg_id=request_id,
            stream=self._topology.build_stream,
        )

    async def publish_hook(self, event: HookEvent) -> None:
        payload = json.dumps(event.as_dict(), sort_keys=True, separators=(",", ":"))
        await self._publish(
            self._topology.hook_subject(event.type),
            payload.encode(),
            msg_id=event.id,
            stream=self._topology.hooks_stream,
        )

    async def _publish(self, subject: str, payload: bytes, *, msg_id: str, stream: str) -> None:
        # stream= makes the server reject a subject captured by some other stream,
        # instead of silently storing our message where nobody consumes it.
        with translated(f"publish {subject} (msg id {msg_id})"):
            await self._js.publish(
                subject,
                payload,
                timeout=self._timeout,
                stream=stream,
                headers={MSG_ID_HEADER: msg_id},
            )
