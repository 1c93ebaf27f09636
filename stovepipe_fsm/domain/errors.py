"""Error kinds shared by the core and every adapter.

The consumer's classifier decides what to do with a failed delivery from the error's
type alone: :class:`Retryable` errors are redelivered with backoff and count toward the
queue's failure budget, except an :class:`EnvironmentFailure`, which is held and never
counts; :class:`NonRetryable` errors go straight to the dead-letter stream. Store errors
are deliberately *neither*: a missing request is non-retryable for process but an
expected branch for ingest, so each caller classifies them.
"""

from __future__ import annotations


class StovepipeError(Exception):
    """Base of every error this package raises on purpose."""


class NotFound(StovepipeError):
    """A key (request, queue, commit) does not exist."""


class AlreadyExists(StovepipeError):
    """A create found the key already present."""


class VersionMismatch(StovepipeError):
    """A compare-and-set lost: the stored version is not the caller's old version."""


class Retryable(StovepipeError):
    """A transient failure (connection, timeout, lost race); redeliver later."""


class NotYetAdmitted(Retryable):
    """An outcome for a request still in the initial state: its head may yet be admitted,
    so the outcome is retried shortly rather than refused."""


class EnvironmentFailure(Retryable):
    """The service's own environment could not do the work (no file descriptor or
    memory to start git, git missing): it says nothing about the message, so the
    delivery is held and alerted on, never counted toward ``max_attempts``."""


class NonRetryable(StovepipeError):
    """A failure redelivery cannot fix (missing row, bad payload); dead-letter it."""


class AlreadyEnded(NonRetryable):
    """An outcome for a request that already ended otherwise: with another outcome, or
    without being admitted (superseded, withdrawn), which makes the outcome moot."""


class IllegalOperation(StovepipeError):
    """An operator asked for something the request's state forbids (cancel a running
    build, retry a head that has not ended): exit 2, with the sentence saying why."""


#: How the flow driver notes, on an exception a condition or action raised, where the
#: YAML declares that step (``file:line:column: in machine ..., state ..., trigger ...``).
STEP_NOTE = "declared at "
#: How a plugin's condition or action notes the line of plugin code that raised.
PLUGIN_FRAME_NOTE = "raised in plugin code at "


def described(exc: BaseException) -> str:
    """``Type: message``, led by the YAML location of the step that raised it, when the
    driver noted one, and followed by the plugin code's line that raised it, when the
    step is a plugin's: what a settle reason, a dead letter and ``test`` print."""
    text = f"{type(exc).__name__}: {exc}"
    notes: list[str] = getattr(exc, "__notes__", [])
    where = next((n.removeprefix(STEP_NOTE) for n in notes if n.startswith(STEP_NOTE)), "")
    frame = next((n for n in notes if n.startswith(PLUGIN_FRAME_NOTE)), "")
    if frame:
        text = f"{text} ({frame})"
    return f"{where}: {text}" if where else text
