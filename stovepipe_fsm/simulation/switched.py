"""One set of ports, pointed at the stores of whichever world steps next.

A :class:`~.world.World` and every fork of it run the same stages: the controller,
ingest, record and the reconciler are built once, through the one factory
(:func:`~..pipeline.wiring.build_stages`), on these ports, and a fork copies only its
rows. Before a world runs a step it binds the ports to its own stores
(:meth:`SwitchedPorts.bind`): each port then *is* the bound world's methods, so a call
through it costs what a call on the world's own store costs.

Why this is sound: a step runs to the end before the next one starts (every simulated
step is one ordinary call), and the stages keep nothing of a world between steps (what a
stalled delivery loaded travels in its paused context, not in the stages). The
controller's metrics and its once-only warnings are the one thing the forks share.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..domain.entities import Queue, QueueConfig, Request
from ..domain.hooks import HookEvent
from ..domain.trail import TrailRecord
from ..pipeline.wiring import Ports
from ..ports.config import ConfigStore
from ..ports.source_control import SourceControl, SourceControlProvider
from ..ports.stores import Counter, QueueStore, RequestStore, UriIndex
from ..ports.trail import DecisionTrail


def _unbound(*args: object, **kwargs: object) -> Any:
    raise RuntimeError("the switched ports were used before a world was bound to them")


class _Requests:
    def __init__(self) -> None:
        self.create: Callable[[Request], Coroutine[Any, Any, None]] = _unbound
        self.get: Callable[[str], Coroutine[Any, Any, Request]] = _unbound
        self.update: Callable[[Request, int, int], Coroutine[Any, Any, None]] = _unbound

    def bind(self, store: RequestStore) -> None:
        self.create, self.get, self.update = store.create, store.get, store.update


class _Queues:
    def __init__(self) -> None:
        self.create: Callable[[Queue], Coroutine[Any, Any, None]] = _unbound
        self.get: Callable[[str], Coroutine[Any, Any, Queue]] = _unbound
        self.update: Callable[[Queue, int, int], Coroutine[Any, Any, None]] = _unbound

    def bind(self, store: QueueStore) -> None:
        self.create, self.get, self.update = store.create, store.get, store.update


class _UriIndex:
    def __init__(self) -> None:
        self.get: Callable[[str, str], Coroutine[Any, Any, str | None]] = _unbound
        self.put_if_absent: Callable[[str, str, str], Coroutine[Any, Any, str]] = _unbound
        self.repoint: Callable[[str, str, str, str], Coroutine[Any, Any, str]] = _unbound

    def bind(self, index: UriIndex) -> None:
        self.get, self.put_if_absent, self.repoint = index.get, index.put_if_absent, index.repoint


class _Counter:
    def __init__(self) -> None:
        self.next: Callable[[str], Coroutine[Any, Any, int]] = _unbound
        self.reserve: Callable[[str, int], Coroutine[Any, Any, int]] = _unbound

    def bind(self, counter: Counter) -> None:
        self.next, self.reserve = counter.next, counter.reserve


class _Config:
    def __init__(self) -> None:
        self.get: Callable[[str], QueueConfig] = _unbound
        self.configured_queues: Callable[[], tuple[str, ...]] = _unbound

    def bind(self, config: ConfigStore) -> None:
        self.get, self.configured_queues = config.get, config.configured_queues


class _SourceControl:
    def __init__(self) -> None:
        self.for_queue: Callable[[str], SourceControl | None] = _unbound

    def bind(self, provider: SourceControlProvider) -> None:
        self.for_queue = provider.for_queue


class _PublishProcess(Protocol):
    def __call__(
        self, queue: str, request_id: str, partition: int = 0
    ) -> Coroutine[Any, Any, None]: ...


class _Publisher:
    def __init__(self) -> None:
        self.publish_process: _PublishProcess = _unbound
        self.publish_build: Callable[[str, str], Coroutine[Any, Any, None]] = _unbound
        self.publish_hook: Callable[[HookEvent], Coroutine[Any, Any, None]] = _unbound

    def bind(self, publisher: PublisherLike) -> None:
        self.publish_process = publisher.publish_process
        self.publish_build = publisher.publish_build
        self.publish_hook = publisher.publish_hook


class _Clock:
    def __init__(self) -> None:
        self.now_ms: Callable[[], int] = _unbound

    def bind(self, clock: ClockLike) -> None:
        self.now_ms = clock.now_ms


class _Trail:
    def __init__(self) -> None:
        self.append: Callable[[TrailRecord], Coroutine[Any, Any, None]] = _unbound
        self.history: Callable[[str], Coroutine[Any, Any, list[TrailRecord]]] = _unbound

    def bind(self, trail: DecisionTrail) -> None:
        self.append, self.history = trail.append, trail.history


class PublisherLike(Protocol):
    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None: ...

    async def publish_build(self, queue: str, request_id: str) -> None: ...

    async def publish_hook(self, event: HookEvent) -> None: ...


class ClockLike(Protocol):
    def now_ms(self) -> int: ...


class WorldPorts(Protocol):
    """What a world binds the ports to: its own stores, config, topic and clock."""

    @property
    def requests(self) -> RequestStore: ...
    @property
    def queues(self) -> QueueStore: ...
    @property
    def uri_index(self) -> UriIndex: ...
    @property
    def counter(self) -> Counter: ...
    @property
    def config(self) -> ConfigStore: ...
    @property
    def source_control(self) -> SourceControlProvider: ...
    @property
    def publisher(self) -> PublisherLike: ...
    @property
    def clock(self) -> ClockLike: ...
    @property
    def trail(self) -> DecisionTrail | None: ...


class SwitchedPorts:
    """The ports a world and its forks build their stages on, bound to one world at a
    time (``bound``); binding the world already bound costs nothing."""

    def __init__(self, *, keep_trail: bool) -> None:
        self.bound: object | None = None
        self._requests = _Requests()
        self._queues = _Queues()
        self._uri_index = _UriIndex()
        self._counter = _Counter()
        self._config = _Config()
        self._source_control = _SourceControl()
        self._publisher = _Publisher()
        self._clock = _Clock()
        self._trail = _Trail() if keep_trail else None

    def ports(self) -> Ports:
        """The ports to build the stages on (once)."""
        return Ports(
            requests=self._requests,
            queues=self._queues,
            uri_index=self._uri_index,
            counter=self._counter,
            config=self._config,
            source_control=self._source_control,
            publisher=self._publisher,
            clock=self._clock,
            trail=self._trail,
        )

    def bind(self, world: WorldPorts) -> None:
        """From now on every port is ``world``'s."""
        if self.bound is world:
            return
        self._requests.bind(world.requests)
        self._queues.bind(world.queues)
        self._uri_index.bind(world.uri_index)
        self._counter.bind(world.counter)
        self._config.bind(world.config)
        self._source_control.bind(world.source_control)
        self._publisher.bind(world.publisher)
        self._clock.bind(world.clock)
        trail = world.trail
        if self._trail is not None and trail is not None:
            self._trail.bind(trail)
        self.bound = world

    def unbind(self) -> None:
        """Forget the bound world: the next :meth:`bind` binds again, even the same one
        (after a world replaced one of its stores)."""
        self.bound = None
