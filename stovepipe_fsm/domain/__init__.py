"""Domain values: Request, Queue, QueueConfig, request ids, hook events, errors.

Entities are immutable snapshots (frozen dataclasses). A write replaces the whole
snapshot under a compare-and-set on ``version``; see ``stovepipe_fsm.ports.stores``.
"""

from .entities import (
    BUILD_STRATEGIES,
    FULL,
    INCREMENTAL_SINCE_GREEN,
    NO_STRATEGY,
    Green,
    Queue,
    QueueConfig,
    Request,
)
from .errors import (
    AlreadyExists,
    NonRetryable,
    NotFound,
    Retryable,
    StovepipeError,
    VersionMismatch,
)
from .hooks import VALIDATION_STARTED, HookEvent, started_event
from .ids import RequestId, compare_request_id, format_request_id, parse_request_id
from .queue_names import InvalidQueueName, validate_queue_name

__all__ = [
    "BUILD_STRATEGIES",
    "FULL",
    "INCREMENTAL_SINCE_GREEN",
    "NO_STRATEGY",
    "VALIDATION_STARTED",
    "AlreadyExists",
    "Green",
    "HookEvent",
    "InvalidQueueName",
    "NonRetryable",
    "NotFound",
    "Queue",
    "QueueConfig",
    "Request",
    "RequestId",
    "Retryable",
    "StovepipeError",
    "VersionMismatch",
    "compare_request_id",
    "format_request_id",
    "parse_request_id",
    "started_event",
    "validate_queue_name",
]
