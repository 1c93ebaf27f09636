"""Registries: the small named Python callables a machine file refers to.

The YAML is the table; Python registers conditions and actions under the names the
YAML uses. Each registration also declares the *facts* the callable establishes or
relies on (``provides`` / ``requires``), which is how lint proves, from the YAML alone,
that no publish step runs before the state write it depends on.

A registry belongs to one machine name (``request`` or ``queue_gate``) and may declare
the roles its code relies on the machine for (``roles``, ``outcomes``; see
:mod:`.roles`) and the ``kind`` of machine the code drives: a YAML edit that drops a
role, or turns a flow into a lifecycle, is a load error instead of a runtime surprise.

The registries in ``process/catalog.py`` hold the built-in vocabulary and are never
changed after import; a policy with plugins works on :meth:`Registry.copy` of them
(:mod:`.plugins`), so one policy's plugin names never leak into another's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .roles import RoleShape

Condition = Callable[[Any], bool]
Action = Callable[[Any], Any]
#: A queue's parameters (name -> value) -> why a condition can never hold ("": it can).
NeverWhen = Callable[[Mapping[str, Any]], str]


class RegistrationRefused(ValueError):
    """A condition or action that cannot be registered (raised by the decorator)."""


class DuplicateName(RegistrationRefused):
    """A name registered twice for one machine."""


@dataclass(frozen=True)
class ConditionInfo:
    name: str
    fn: Condition
    provides: frozenset[str] = frozenset()
    provides_unless: frozenset[str] = frozenset()
    doc: str = ""
    parameters: frozenset[str] = frozenset()
    origin: str = ""  # the plugin that registered it; "" for the built-in vocabulary
    #: Why the condition can never hold under a queue's parameters (name -> value), or
    #: "" when it may: what the policy card reads to leave out the transitions that
    #: cannot fire for a queue. None: it may always hold, as far as anyone declared.
    never_when: NeverWhen | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ActionInfo:
    name: str
    fn: Action
    provides: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    finishes: bool = False
    doc: str = ""
    parameters: frozenset[str] = frozenset()
    origin: str = ""  # the plugin that registered it; "" for the built-in vocabulary


@dataclass
class Registry:
    """Named conditions and actions for one machine."""

    machine: str
    kind: str | None = None
    roles: Mapping[str, RoleShape] = field(default_factory=dict)
    outcomes: bool = False
    conditions: dict[str, ConditionInfo] = field(default_factory=dict)
    actions: dict[str, ActionInfo] = field(default_factory=dict)
    origin: str = ""  # recorded on every registration made through this registry

    def copy(self, *, origin: str = "", empty: bool = False) -> Registry:
        """The same machine's registry, with its own tables (empty ones if ``empty``)."""
        conditions, actions = ({}, {}) if empty else (dict(self.conditions), dict(self.actions))
        return replace(self, conditions=conditions, actions=actions, origin=origin)

    def condition(
        self,
        name: str | None = None,
        *,
        provides: Iterable[str] = (),
        provides_unless: Iterable[str] = (),
        parameters: Iterable[str] = (),
        never_when: NeverWhen | None = None,
    ) -> Callable[[Condition], Condition]:
        """Register a predicate over the machine's context.

        ``provides``: facts that hold when it is true; ``provides_unless``: when false.
        ``parameters``: the machine parameters it reads (lint checks they are declared).
        ``never_when``: given a queue's parameters, why the predicate can never be true
        for it ("" when it can), for the policy card.
        A coroutine function is refused: the machine decides without awaiting, so it
        would only ever see the coroutine object, which is truthy.
        """

        def register(fn: Condition) -> Condition:
            key = name or fn.__name__
            if _is_coroutine_function(fn):
                raise RegistrationRefused(
                    f"{self.machine}: condition {key!r} is a coroutine function; conditions "
                    "must be synchronous predicates (load what a condition reads in an "
                    "action that runs before it)"
                )
            self._check_free(key)
            self.conditions[key] = ConditionInfo(
                key,
                fn,
                frozenset(provides),
                frozenset(provides_unless),
                first_paragraph(fn),
                frozenset(parameters),
                self.origin,
                never_when,
            )
            return fn

        return register

    def action(
        self,
        name: str | None = None,
        *,
        provides: Iterable[str] = (),
        requires: Iterable[str] = (),
        finishes: bool = False,
        parameters: Iterable[str] = (),
    ) -> Callable[[Action], Action]:
        """Register an action (sync or async) over the machine's context.

        ``requires``: facts that must hold on every path before it runs (lint checks).
        ``finishes``: it decides how the delivery ends (ack/hold), which the runtime then
        settles; only the last step of a flow.
        ``parameters``: the machine parameters it reads (lint checks they are declared).
        """

        def register(fn: Action) -> Action:
            key = name or fn.__name__
            self._check_free(key)
            self.actions[key] = ActionInfo(
                key,
                fn,
                frozenset(provides),
                frozenset(requires),
                finishes,
                first_paragraph(fn),
                frozenset(parameters),
                self.origin,
            )
            return fn

        return register

    def _check_free(self, key: str) -> None:
        if key in self.conditions or key in self.actions:
            raise DuplicateName(f"{self.machine}: {key!r} is registered twice")


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, and objects whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def first_paragraph(fn: Callable[..., Any]) -> str:
    """The first paragraph of a docstring on one line (shown in diagram legends)."""
    paragraph = (fn.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())
