"""The generated flow driver: names from a policy are never code in its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from stovepipe_fsm.spec.flow_codegen import generate


@dataclass(frozen=True)
class FakeStep:
    dest: str


@dataclass
class Ctx:
    log: list[str] = field(default_factory=list)
    via: object = None


HOSTILE = "s\nimport os; os._exit(3)  # '\"\\"


def run(coro: object) -> object:
    try:
        coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as stop:
        return stop.value
    raise AssertionError("suspended")


def test_hostile_names_stay_string_literals() -> None:
    """A state, trigger and action named with a newline, quotes and code: the driver
    still runs the one transition, and reports the names as they were given."""
    step = FakeStep(dest="end")
    calls = ((HOSTILE, lambda ctx: ctx.log.append("ran"), False),)
    errors: list[tuple[str, str]] = []

    def unmet(trigger: str, state: str) -> Exception:
        errors.append((trigger, state))
        return RuntimeError("unmet")

    def driver(answer: bool) -> Any:
        """One transition out of HOSTILE, guarded by a condition answering ``answer``."""
        guard = ((HOSTILE, lambda ctx: answer, True),)
        return generate(
            [HOSTILE, "end"],
            HOSTILE,
            frozenset({"end"}),
            {HOSTILE: (HOSTILE, ((guard, (step, calls)),))},
            max_steps=4,
            unmet=unmet,
            over_budget=lambda state: RuntimeError(state),
            no_way_out=lambda state: RuntimeError(state),
        )

    settle = driver(True)
    probed: list[str] = []
    ctx = Ctx()
    assert run(settle(ctx, probed.append)) == ("end", step)
    assert ctx.log == ["ran"] and probed == [HOSTILE] and ctx.via is step
    source = settle.source  # type: ignore[attr-defined]
    assert "import os" not in source.replace(repr(HOSTILE), "")

    with pytest.raises(RuntimeError, match="unmet"):
        run(driver(False)(Ctx(), None))
    assert errors == [(HOSTILE, HOSTILE)]
