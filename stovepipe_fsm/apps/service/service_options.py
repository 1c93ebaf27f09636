"""How a :class:`~.supervisor.Service` runs: waits, intervals and how much it does at once."""

from __future__ import annotations

from dataclasses import dataclass

from ...adapters.jetstream.consumer import DEFAULT_ACK_WAIT_S, DEFAULT_FETCH_TIMEOUT_S
from ...domain.settle import DEFAULT_RETRY_BASE_S, DEFAULT_RETRY_CAP_S


@dataclass(frozen=True)
class ServiceOptions:
    #: How long a message in hand may go without a sign of life before the broker hands
    #: it to another replica; :class:`~.keepalive.KeptAlive` keeps long steps inside it.
    ack_wait_s: float = DEFAULT_ACK_WAIT_S
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    retry_cap_s: float = DEFAULT_RETRY_CAP_S
    #: How often the queues bucket is listed for queues that ingest created (a publish
    #: for a new queue starts its consumer at once; this catches what a disconnect hid).
    discover_interval_s: float = 30.0
    #: How often heads left accepted with no process message (an ingest cut short) are
    #: looked for and published (:mod:`.unpublished`), and how long after its ingest a
    #: head must have been waiting for that.
    unpublished_interval_s: float = 60.0
    unpublished_after_s: float = 60.0
    #: How many consumers are created or bound at once on start and discovery.
    open_concurrency: int = 64
    #: Create the consumers of queues without work behind start (``False``: only when a
    #: queue's first message is published, or discovery finds one waiting) ...
    warm_up: bool = True
    #: ... this many at a time: few, so that the broker, which creates consumers one after
    #: the other, still answers the heartbeat and the queues with work meanwhile.
    warm_up_concurrency: int = 8
    #: How long a stop waits for in-hand messages before handing them back.
    shutdown_timeout_s: float = 10.0
    #: How often the machines directory and the config file are checked for edits.
    policy_check_interval_s: float = 1.0
    #: How often the queues refused a consumer (at the account's JetStream limit) are
    #: tried again, when the process stream has room by then; and the plain
    #: subscriptions the broker refused.
    refused_retry_s: float = 60.0
    #: How often a JetStream round trip proves the broker answers (``/healthz``) ...
    heartbeat_interval_s: float = 1.0
    #: ... and how old the last successful one may be before the service is unhealthy.
    health_window_s: float = 5.0
    #: Terminal requests older than this are pruned (with their uri-index entries);
    #: ``None`` keeps them for ever.
    prune_older_than_s: float | None = None
    #: How often the prune runs when ``prune_older_than_s`` is set.
    prune_interval_s: float = 3600.0
