"""``expect:`` steps of a timeline: what they assert, and whether the world agrees.

An expect step asserts on the simulated world at that point of the timeline, about one
request (named by its uri) or one queue::

    - expect: {request: D, state: processing, strategy: incremental_since_green, base: A}
    - expect: {request: B, state: superseded, superseded_by: D}
    - expect: {request: D, holds: 1, hold_reason: gate_closed}
    - expect: {request: E, state: processing, strategy: full, why: no last green}
    - expect: {in_flight: 1, last_green: A, latest: D, builds: [A, D], holds: 2}

Every key but ``request`` and ``queue`` is one check, reported on its own at the key's
``file:line:column`` as ``expected X, got Y``. Commits and requests are written as the
uris the timeline ingested (the request ids a run mints are an implementation detail);
``null`` means "none" (no strategy, no base, not superseded, no last green, no hold).
State names are the request machine's own: they are checked against the machine the
timeline runs on before anything runs, never against a fixed list.

Parsing here sees only the YAML (the schema already checked the types); evaluation
(:func:`evaluate`) reads the world through its stores, never by changing it, so an
expect step can sit anywhere in a timeline without altering what follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..domain.entities import NO_STRATEGY, Request
from ..domain.errors import NotFound
from ..domain.trail_record import ADMITTED, SKIPPED
from ..located.errors import Location, SpecIssue
from ..located.yaml_source import JsonPath, SourceDocument
from .broker import run_sync
from .world import World

REQUEST_CHECKS = ("state", "strategy", "base", "superseded_by", "holds", "hold_reason", "why")
QUEUE_CHECKS = ("in_flight", "last_green", "latest", "builds", "holds")
NONE = "none"  # how an absent value (null in YAML) is shown

Value = str | int | tuple[str, ...] | None


@dataclass(frozen=True)
class Check:
    """One asserted key of an expect step: its name, the value written, and where."""

    key: str
    expected: Value
    location: Location


@dataclass(frozen=True)
class Expectation:
    """An expect step: about a request (``uri`` set) or about a queue (``uri`` empty)."""

    queue: str
    uri: str
    checks: tuple[Check, ...]
    location: Location  # of the step's ``request:`` key, else of its ``expect:`` key

    @property
    def subject(self) -> str:
        return f"request {self.uri}" if self.uri else f"queue {self.queue}"


@dataclass(frozen=True)
class Result:
    """A check as evaluated: ``message`` is ``expected X, got Y`` when it failed."""

    check: Check
    passed: bool
    message: str = ""

    @property
    def issue(self) -> SpecIssue:
        """The failure as a located line (``file:line:column: expected X, got Y``)."""
        return SpecIssue(self.check.location, self.message, "expect")


# --- parsing ----------------------------------------------------------------------------


def parse_expectation(
    doc: SourceDocument, index: int, default_queue: str
) -> tuple[Expectation, list[SpecIssue]]:
    """The expect step ``steps[index]`` of a schema-valid ``doc``, and what is wrong with it.

    The schema allows every key of both kinds; whether they belong together is said here,
    at the key, because "which kind is this" is what the user needs to know.
    """
    body: dict[str, Any] = doc.data["steps"][index]["expect"]
    inner: JsonPath = ("steps", index, "expect")
    uri = str(body.get("request", ""))
    queue = str(body.get("queue", default_queue))
    allowed, other = (REQUEST_CHECKS, QUEUE_CHECKS) if uri else (QUEUE_CHECKS, REQUEST_CHECKS)
    issues: list[SpecIssue] = []
    checks: list[Check] = []
    for key, value in body.items():
        if key in ("request", "queue"):
            continue
        where = doc.locate((*inner, key), key=True)
        if key not in allowed and key in other:
            issues.append(SpecIssue(where, _misplaced(key, bool(uri))))
            continue
        checks.append(Check(key, tuple(value) if isinstance(value, list) else value, where))
    head = doc.locate((*inner, "request"), key=True) if uri else doc.locate(inner, key=True)
    if not checks and not issues:
        kind = "request" if uri else "queue"
        message = f"expect asserts nothing about the {kind}; give at least one of: "
        issues.append(SpecIssue(head, message + ", ".join(allowed)))
    return Expectation(queue, uri, tuple(checks), head), issues


def _misplaced(key: str, about_request: bool) -> str:
    if about_request:
        return (
            f"{key!r} is about a queue, and this expect step is about a request (request:); "
            f"a request's checks are: {', '.join(REQUEST_CHECKS)} - "
            "put the queue's in an expect step of its own"
        )
    return (
        f"{key!r} is about a request: name it with 'request: URI' "
        f"(a queue's checks are: {', '.join(QUEUE_CHECKS)})"
    )


def state_issues(expectation: Expectation, states: Sequence[str]) -> list[SpecIssue]:
    """Expected states the request machine does not declare (a typo, or an old name)."""
    return [
        SpecIssue(
            check.location,
            f"state {check.expected!r} is not a state of the request machine; "
            f"declared states: {', '.join(states)}",
        )
        for check in expectation.checks
        if check.key == "state" and check.expected not in states
    ]


# --- evaluation -------------------------------------------------------------------------


def evaluate(world: World, expectation: Expectation) -> list[Result]:
    """Every check of ``expectation`` against ``world`` as it stands now."""
    if expectation.uri:
        return _request_results(world, expectation)
    return [_queue_result(world, expectation, check) for check in expectation.checks]


def _request_results(world: World, expectation: Expectation) -> list[Result]:
    request_id = world.request_for(expectation.queue, expectation.uri)
    request = world.find_request(request_id) if request_id else None
    if request is None:
        # One failure for the step, at its ``request:`` key: no check can be evaluated.
        missing = Check("request", expectation.uri, expectation.location)
        message = f"expected a request for {expectation.uri} in queue {expectation.queue}, got none"
        return [Result(missing, False, message)]
    return [
        _compare(expectation, check, _request_value(world, request, check.key))
        for check in expectation.checks
    ]


def _request_value(world: World, request: Request, key: str) -> Value:
    if key == "state":
        return request.state
    if key == "strategy":
        return request.build_strategy if request.build_strategy != NO_STRATEGY else None
    if key == "base":
        return request.base_uri or None
    if key == "superseded_by":
        return _uri_of(world, request.superseded_by) if request.superseded_by else None
    if key == "why":
        return _why(world, request.id)
    holds = [h for h in world.hold_log if h.request_id == request.id]
    if key == "holds":
        return len(holds)
    if key == "hold_reason":
        return holds[-1].reason if holds else None
    raise ValueError(f"unknown request check {key!r}")


def _why(world: World, request_id: str) -> str | None:
    """The reason the trail notes for the request's last admission or skip."""
    if world.trail is None:
        return None
    for record in reversed(world.trail.records):
        if record.request_id == request_id and record.kind in (ADMITTED, SKIPPED):
            d = record.details
            return d.get("why") or d.get("matched") or None
    return None


def _queue_result(world: World, expectation: Expectation, check: Check) -> Result:
    queue, key = expectation.queue, check.key
    actual: Value
    if key == "builds":
        builds = [p for p in world.published.unique("build") if p.queue == queue]
        actual = tuple(_uri_of(world, p.request_id) for p in builds)
    elif key == "holds":
        actual = sum(1 for h in world.hold_log if h.queue == queue)
    else:
        try:
            row = run_sync(world.queues.get(queue))
        except NotFound:
            message = (
                f"expected {expectation.subject} {key} {_show(check.expected)}, got no queue row"
            )
            return Result(check, False, message)
        if key == "in_flight":
            actual = row.in_flight_count
        elif key == "last_green":
            actual = row.last_green_uri or None
        elif key == "latest":
            actual = _uri_of(world, row.latest_request_id) if row.latest_request_id else None
        else:
            raise ValueError(f"unknown queue check {key!r}")
    return _compare(expectation, check, actual)


def _compare(expectation: Expectation, check: Check, actual: Value) -> Result:
    if actual == check.expected:
        return Result(check, True)
    message = (
        f"expected {expectation.subject} {check.key} {_show(check.expected)}, got {_show(actual)}"
    )
    return Result(check, False, message)


def _show(value: Value) -> str:
    if value is None:
        return NONE
    if isinstance(value, tuple):
        return "[" + ", ".join(value) + "]"
    return str(value)


def _uri_of(world: World, request_id: str) -> str:
    """The uri a request was ingested for; its id if it cannot be loaded."""
    request = world.find_request(request_id)
    return request.uri if request is not None else request_id
