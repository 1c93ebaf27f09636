"""Translate nats client errors into the domain's error kinds.

The consumer classifies a failed delivery by error type alone (``Retryable`` vs
``NonRetryable``), so no nats exception may escape the adapter: a broker that is
restarting, a lost connection or a slow reply is transient; a request the server rejects
as malformed (bad key, payload too large) will be rejected again on every redelivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import nats.errors
import nats.js.errors

from ...domain.errors import NonRetryable, Retryable, StovepipeError

#: JetStream ``err_code`` of "wrong last sequence": an expected-revision write lost a race.
WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})
#: JetStream ``err_code`` of "maximum consumers limit reached".
MAX_CONSUMERS_CODE = 10026
#: JetStream ``err_code`` of "stream name already in use with a different configuration".
STREAM_NAME_IN_USE_CODE = 10058
#: JetStream ``err_code`` of "no message found": a delete of a message deleted already.
NO_MESSAGE_CODE = 10057

_PERMANENT = (
    nats.errors.MaxPayloadError,
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
    nats.errors.AuthorizationError,
    nats.js.errors.InvalidKeyError,
    nats.js.errors.InvalidBucketNameError,
    nats.js.errors.BadRequestError,
)


class TopologyMismatch(NonRetryable):
    """A stream or bucket exists with a configuration this service cannot safely use."""


def is_wrong_last_sequence(exc: BaseException) -> bool:
    if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code in WRONG_LAST_SEQUENCE_CODES


def is_no_message(exc: BaseException) -> bool:
    """A message delete found nothing: another delete of it came first."""
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == NO_MESSAGE_CODE


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise any nats (or socket/timeout) error from the block as a domain error.

    ``what`` names the operation ("get request request/q/1"), so the message a log or
    dead-letter entry carries says what was being attempted. Domain errors pass through.
    """
    try:
        yield
    except StovepipeError:
        raise
    except _PERMANENT as exc:
        raise NonRetryable(f"{what}: {exc}") from exc
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        raise Retryable(f"{what}: {type(exc).__name__}: {exc}") from exc
