"""Shared fixtures (the real-broker ones live in ``tests/nats_server.py``) and the tiers.

Tiers (markers in pyproject.toml): ``make test`` runs the tests that carry none of
``nats``, ``slow``, ``container``, ``cluster``, ``browser``; ``make test-all`` runs them
all. A test whose fixtures include the shared broker is marked ``nats`` here, so that
mark cannot drift from what the test uses. A test that starts a broker of its own
carries the mark itself, and fails if it forgets it (in this process; a broker started
by a child process is not seen).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest
from nats_server import js_env, nats_server

from stovepipe_fsm.adapters.jetstream import NatsServer

__all__ = ["js_env", "nats_server"]

#: Marks under which a test may start a nats-server.
BROKER_MARKS = ("nats", "cluster", "browser")

_running: list[pytest.Item] = []
_start = NatsServer.start


def _start_when_marked(server: NatsServer) -> NatsServer:
    """``NatsServer.start``, refused to a test without a broker mark (its fixtures too)."""
    if _running and not any(_running[-1].get_closest_marker(m) for m in BROKER_MARKS):
        raise pytest.fail.Exception(
            f"{_running[-1].nodeid} starts a nats-server but is not marked "
            "@pytest.mark.nats (the nats_server fixture marks its users)",
            pytrace=False,
        )
    return _start(server)


def pytest_configure(config: pytest.Config) -> None:
    NatsServer.start = _start_when_marked  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    NatsServer.start = _start  # type: ignore[method-assign]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "nats_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.nats)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()
