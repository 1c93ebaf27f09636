"""Timeline files for ``simulate`` and ``test``: parsed once, validated with located errors.

A step either acts on the world (ingest, deliver, complete, ...) or asserts on it
(``expect``, parsed by :mod:`.expectations`); an asserting step carries its parsed form
in :attr:`TimelineStep.expect` and is never applied to the world.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.memory.source_control import parents_first
from ..domain.entities import RUNTIME_KEYS
from ..domain.queue_names import InvalidQueueName, validate_queue_name
from ..located.errors import Location, SpecError, SpecIssue
from ..located.schema import load_schema, schema_issues
from ..located.yaml_source import (
    MAX_VALUES,
    SourceDocument,
    parse_yaml,
    parse_yaml_fast,
    read_text,
)
from ..machine.model import ParameterSpec
from ..machine.parameters import as_json, value_problems
from . import timeline_shape as shape
from .builds import Culprit, RecordedBuild
from .expectations import Expectation, parse_expectation
from .timeline_lines import BULK, is_lines, parse_lines

DEFAULT_QUEUE = "monorepo/main"
#: The largest timeline file read: recorded history runs to tens of MB, policy files
#: (bounded far lower) to a few KiB.
MAX_TIMELINE_BYTES = 512 * 1024 * 1024

Locate = Callable[[tuple[str | int, ...], bool], Location]


@dataclass(frozen=True)
class TimelineStep:
    """One step: ``kind`` is the step's key (deliver, ingest, complete, cancel, expect, ...)."""

    kind: str
    location: Location
    uri: str = ""
    queue: str = ""
    outcome: str = ""
    amount: int = 0
    value: str = ""
    expect: Expectation | None = None
    values: tuple[tuple[str, Any], ...] = ()  # a config step's parameters, sorted by name

    def describe(self) -> str:
        if self.expect is not None:
            return f"expect {self.expect.subject}"
        if self.kind in ("deliver", "run"):
            return self.kind
        if self.kind in ("advance_ms", "run_ms"):
            return f"{self.kind} {self.amount}"
        if self.kind == "complete":
            return f"complete {self.uri} {self.outcome}"
        if self.kind in ("crash", "source_control", "stall"):
            return f"{self.kind} {self.value}"
        if self.kind == "config":
            return f"config {self.queue} " + " ".join(
                f"{k}={json.dumps(as_json(v))}" for k, v in self.values
            )
        return f"{self.kind} {self.uri}"


Changes = tuple[str, ...] | dict[str, str]


@dataclass(frozen=True)
class Timeline:
    file: str
    queue: str
    steps: tuple[TimelineStep, ...]
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[str, tuple[str, ...]] = field(default_factory=dict)
    config_location: Location = field(default_factory=lambda: Location("", 0, 0))
    #: commit -> its changed paths: a tuple, or a map of path -> content id.
    changes: dict[str, Changes] = field(default_factory=dict)
    #: The builds a live run recorded, in admission order (``export`` writes them).
    builds: tuple[RecordedBuild, ...] = ()
    #: Commits declared to break the build (``None``: none declared) and the chance a
    #: build that would go green goes red (:mod:`.builds`).
    culprits: tuple[Culprit, ...] | None = None
    flake_rate: float = 0.0


def load_timeline(path: str | Path) -> Timeline:
    """Read a timeline file: YAML, or JSON lines (:mod:`.timeline_lines`) by its suffix
    or its first line.

    A large file takes the fast path: the C YAML parser (or ``json``) and the hand-written
    checks of :mod:`.timeline_shape`. Whatever the fast path does not accept is read again
    the located way (every value with its ``file:line:column``, the JSON schema), which
    reports each defect where it is; a valid file gives the same timeline either way.
    """
    name = str(path)
    text = read_text(path, name, max_bytes=MAX_TIMELINE_BYTES)
    if is_lines(path, text[:4096].encode()):
        doc = parse_lines(text, name)
        steps_at = tuple(doc.locate(("steps", i)) for i in range(len(doc.data["steps"])))
        builds_at = tuple(doc.locate(("builds", i)) for i in range(len(doc.data.get("builds", []))))
        fast = _fast_timeline(name, doc.data, steps_at, doc.locate(("config",)), builds_at)
        return fast if fast is not None else located_timeline(doc)
    quick = parse_yaml_fast(text, name, "steps")
    if quick is not None:
        config_at = quick.top.get("config", Location(name, 1, 1))
        fast = _fast_timeline(name, quick.data, quick.items, config_at)
        if fast is not None:
            return fast
    # Without aliases a document has fewer values than characters: the bound admits every
    # such file and still stops an alias bomb after work proportional to the file.
    return located_timeline(parse_yaml(text, name, max_values=max(MAX_VALUES, len(text))))


def _fast_timeline(
    file: str,
    data: dict[str, Any],
    steps_at: tuple[Location, ...],
    config_at: Location,
    builds_at: tuple[Location, ...] = (),
) -> Timeline | None:
    """The timeline of ``data`` when every check passes on the fast path; ``None`` as soon
    as one does not (the located path then says what and where), or for a timeline with
    ``expect`` steps (whose checks are located key by key)."""
    steps_data = data.get("steps")
    if type(steps_data) is not list or len(steps_data) != len(steps_at):
        return None
    header = {k: v for k, v in data.items() if k not in BULK}
    if not shape.header_valid(header):
        return None
    history_data = data.get("history", {})
    changes_data = data.get("changes", {})
    builds_data = data.get("builds", [])
    valid = shape.commits_valid(history_data) and shape.changes_valid(changes_data)
    if not (valid and shape.builds_valid(builds_data)):
        return None
    queue = data.get("queue", DEFAULT_QUEUE)
    issues: list[SpecIssue] = []  # any issue sends the file to the located path
    checked: set[str] = set()

    def check_queue(name: str, where: Location) -> None:
        if name not in checked:
            _check_queue(name, where, issues)
            checked.add(name)

    check_queue(queue, Location(file, 1, 1))
    steps = []
    for raw, where in zip(steps_data, steps_at, strict=True):
        if not (shape.step_decided(raw) and shape.step_valid(raw)):
            return None
        steps.append(_step(raw, where, queue))
        check_queue(steps[-1].queue, where)
    builds = []
    for index, raw in enumerate(builds_data):
        builds.append(_build(raw, builds_at[index] if builds_at else Location(file, 1, 1), queue))
        check_queue(builds[-1].queue, builds[-1].location)
    parts = (file, queue, tuple(steps), tuple(builds), config_at)
    return _timeline(data, parts, lambda *_: Location(file, 1, 1), issues)


def located_timeline(doc: SourceDocument) -> Timeline:
    """The timeline of ``doc``, every defect reported at its location."""
    issues = _schema_issues(doc)
    if issues:
        raise SpecError(issues)
    data: dict[str, Any] = doc.data
    queue = data.get("queue", DEFAULT_QUEUE)
    _check_queue(queue, doc.locate(("queue",)), issues)
    steps = []
    for index, raw in enumerate(data["steps"]):
        where = doc.locate(("steps", index))
        if isinstance(raw, dict) and "expect" in raw:
            expectation, found = parse_expectation(doc, index, queue)
            issues += found
            step = TimelineStep(
                "expect", where, expectation.uri, expectation.queue, expect=expectation
            )
            if step.queue != queue:
                _check_queue(step.queue, doc.locate(("steps", index, "expect", "queue")), issues)
        else:
            step = _step(raw, where, queue)
            if step.queue != queue:
                _check_queue(step.queue, where, issues)
        steps.append(step)
    builds = []
    for index, raw in enumerate(data.get("builds", [])):
        build = _build(raw, doc.locate(("builds", index)), queue)
        if build.queue != queue:
            _check_queue(build.queue, build.location, issues)
        builds.append(build)
    parts = (doc.file, queue, tuple(steps), tuple(builds), doc.locate(("config",)))
    timeline = _timeline(data, parts, lambda path, key: doc.locate(path, key=key), issues)
    if timeline is None:
        raise SpecError(issues)
    return timeline


_Parts = tuple[str, str, tuple[TimelineStep, ...], tuple[RecordedBuild, ...], Location]


def _timeline(
    data: dict[str, Any], parts: _Parts, locate: Locate, issues: list[SpecIssue]
) -> Timeline | None:
    """The timeline of ``parts`` (file, queue, steps, builds, where its config is) with
    ``data``'s history, changes, config, culprits and flake rate; ``None`` when
    ``issues`` holds any (these checks' or the caller's)."""
    file, queue, steps, builds, config_at = parts
    history = {str(k): tuple(v) for k, v in data.get("history", {}).items()}
    _check_history(history, locate, issues)
    changes = {str(k): _paths(v) for k, v in data.get("changes", {}).items()}
    for commit in (c for c in changes if c not in history):
        where = locate(("changes", commit), True)
        issues.append(SpecIssue(where, f"changes: {commit!r} is not a commit of the history"))
    culprits, flake_rate = read_culprits(data, history, locate, issues)
    if issues:
        return None
    config = {str(k): _hashable(v) for k, v in data.get("config", {}).items()}
    if "config" not in data:
        config_at = Location(file, 1, 1)
    return Timeline(
        file, queue, steps, config, history, config_at, changes, builds, culprits, flake_rate
    )


# --- culprits: and flake_rate ---------------------------------------------------------
# Which commits broke the build, and how flaky builds are (what :mod:`.builds` ends
# builds with). The schema checks their shape; what it cannot see is checked here, each
# at its location: a culprit (and its fix) must be a commit of the history, a fix must
# descend from its culprit on the first-parent line (elsewhere it would fix nothing),
# and both keys need recorded builds, whose durations the builds they end take.


def read_culprits(
    data: Mapping[str, Any],
    history: Mapping[str, Sequence[str]],
    locate: Locate,
    issues: list[SpecIssue],
) -> tuple[tuple[Culprit, ...] | None, float]:
    """The declared culprits (``None`` when the timeline declares none) and the flake
    rate of a timeline whose shape the schema accepted; problems go to ``issues``."""
    flake_rate = float(data.get("flake_rate", 0.0))
    culprits = None
    if "culprits" in data:
        listed = enumerate(data["culprits"])
        culprits = tuple(_culprit(raw, i, history, locate, issues) for i, raw in listed)
    for key in ("culprits", "flake_rate"):
        if key in data and not data.get("builds"):
            needs = "needs the timeline's recorded builds (builds:), whose durations the builds"
            issues.append(SpecIssue(locate((key,), True), f"{key}: {needs} it ends take"))
    return culprits, flake_rate


def _culprit(
    raw: str | Mapping[str, str],
    index: int,
    history: Mapping[str, Sequence[str]],
    locate: Locate,
    issues: list[SpecIssue],
) -> Culprit:
    commit = raw if isinstance(raw, str) else raw["commit"]
    fixed_by = "" if isinstance(raw, str) else raw.get("fixed_by", "")
    where = locate(("culprits", index), False)
    problem = ""
    if commit not in history:
        problem = f"{commit!r} is not a commit of the history"
    elif fixed_by and fixed_by not in history:
        problem = f"fixed_by {fixed_by!r} is not a commit of the history"
    elif fixed_by and not _on_first_parents(history, fixed_by, commit):
        problem = (
            f"fixed_by {fixed_by!r} does not descend from {commit!r} on its first-parent "
            "line, so it fixes nothing"
        )
    if problem:
        issues.append(SpecIssue(where, f"culprits[{index}]: {problem}"))
    return Culprit(commit, fixed_by, where)


def _on_first_parents(history: Mapping[str, Sequence[str]], head: str, commit: str) -> bool:
    """Whether ``commit`` is a strict first-parent ancestor of ``head``."""
    seen: set[str] = set()
    parents = history.get(head, ())
    while parents and parents[0] not in seen:
        first = parents[0]
        if first == commit:
            return True
        seen.add(first)
        parents = history.get(first, ())
    return False


def config_issues(timeline: Timeline, declared: Mapping[str, ParameterSpec]) -> list[SpecIssue]:
    """Parameters the timeline sets (``config:`` and its ``config`` steps) that the
    machines do not declare, or values their declarations refuse."""
    issues: list[SpecIssue] = []
    settings = [(timeline.config_location, tuple(timeline.config.items()))]
    settings += [(s.location, s.values) for s in timeline.steps if s.kind == "config"]
    allowed = ", ".join(sorted({*declared, *RUNTIME_KEYS}))
    for where, values in settings:
        for name, value in values:
            parameter = declared.get(name)
            if parameter is None:
                if name not in RUNTIME_KEYS:
                    unknown = f"config: unknown parameter {name!r}; allowed: {allowed}"
                    issues.append(SpecIssue(where, unknown))
                continue
            for problem in value_problems(parameter, value):
                issues.append(SpecIssue(where, f"config: {name}: {problem}"))
    return issues


def has_expectations(timeline: Timeline) -> bool:
    """Whether the timeline asserts anything (``stovepipe-fsm test`` counts only those)."""
    return any(step.expect is not None for step in timeline.steps)


def _step_kinds() -> tuple[str, ...]:
    """The step names the timeline schema accepts, in its order (bare names, then keys)."""
    kinds: list[str] = []
    for branch in _step_schema()["oneOf"]:
        kinds += branch.get("enum", []) + branch.get("required", [])
    return tuple(kinds)


def _step_schema() -> dict[str, Any]:
    step: dict[str, Any] = load_schema("timeline")["$defs"]["step"]
    return step


def _step_hint() -> str:
    """``a step is one of: ...``, from the schema's own message for a value that is no step."""
    return str(_step_schema()["errorMessage"]).partition("; ")[2]


def _schema_issues(doc: SourceDocument) -> list[SpecIssue]:
    """The schema's issues, with a step of an unknown name reported by that name.

    The schema can only say that such a step matches none of its alternatives; the name
    the user wrote (a typo, usually) is what tells them which line to fix and how.
    """
    named = {issue.location: issue for issue in _unknown_steps(doc)}
    hint = _step_hint()
    return [
        named.get(issue.location, issue) if issue.message.endswith(hint) else issue
        for issue in schema_issues(doc, "timeline")
    ]


def _unknown_steps(doc: SourceDocument) -> list[SpecIssue]:
    steps = doc.data.get("steps") if isinstance(doc.data, dict) else None
    if not isinstance(steps, list):
        return []
    kinds, hint = _step_kinds(), _step_hint()
    issues = []
    for index, raw in enumerate(steps):
        name = raw if isinstance(raw, str) else None
        if isinstance(raw, dict) and len(raw) == 1:
            name = next(iter(raw))
        if isinstance(name, str) and name not in kinds:
            where = doc.locate(("steps", index))
            issues.append(SpecIssue(where, f"steps[{index}]: unknown step {name!r}; {hint}"))
    return issues


def _check_queue(queue: str, where: Location, issues: list[SpecIssue]) -> None:
    try:
        validate_queue_name(queue)
    except InvalidQueueName as exc:
        issues.append(SpecIssue(where, str(exc)))


def _check_history(
    history: dict[str, tuple[str, ...]], locate: Locate, issues: list[SpecIssue]
) -> None:
    """Report parents the graph does not define, and parent cycles, at their location.

    The in-memory source control refuses such a graph; checking here turns what would be
    a crash mid-run into a located input error like every other timeline mistake.
    """
    for commit, parents in history.items():
        for index, parent in enumerate(parents):
            if parent not in history:
                message = (
                    f"history: parent {parent!r} of commit {commit!r} is not a commit "
                    "of the history; list it with its own parents (a root has [])"
                )
                issues.append(SpecIssue(locate(("history", commit, index), False), message))
    # Place commits after their parents; what cannot be placed is on or behind a cycle
    # (an undefined parent, already reported above, counts as placed).
    _, pending = parents_first(
        {commit: [p for p in parents if p in history] for commit, parents in history.items()}
    )
    for commit in sorted(pending):
        message = f"history: commit {commit!r} is on or descends from a parent cycle"
        issues.append(SpecIssue(locate(("history", commit), False), message))


def _step(raw: str | dict[str, Any], where: Location, queue: str) -> TimelineStep:
    if isinstance(raw, str):
        return TimelineStep(raw, where, queue=queue)
    ((kind, value),) = raw.items()
    if kind in ("advance_ms", "run_ms"):
        return TimelineStep(kind, where, queue=queue, amount=int(value))
    if kind in ("crash", "source_control", "stall"):
        return TimelineStep(kind, where, queue=queue, value=str(value))
    if kind == "complete":
        return TimelineStep(
            kind, where, uri=value["uri"], queue=value.get("queue", queue), outcome=value["outcome"]
        )
    if kind == "config":
        values = {k: _hashable(v) for k, v in value.items() if k != "queue"}
        return TimelineStep(
            kind, where, queue=value.get("queue", queue), values=tuple(sorted(values.items()))
        )
    if isinstance(value, str):
        return TimelineStep(kind, where, uri=value, queue=queue)
    return TimelineStep(kind, where, uri=value["uri"], queue=value.get("queue", queue))


def _paths(value: list[str] | dict[str, str]) -> Changes:
    """A commit's changes as given: paths, or paths with their content ids."""
    return dict(value) if isinstance(value, dict) else tuple(value)


def _build(raw: dict[str, Any], where: Location, queue: str) -> RecordedBuild:
    return RecordedBuild(
        raw.get("queue", queue), raw["uri"], int(raw["duration_ms"]), raw["outcome"], where
    )


def _hashable(value: Any) -> Any:
    """A list as a tuple, so a step stays a hashable value."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
