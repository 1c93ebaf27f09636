"""Ports: the narrow interfaces the core talks to.

Every external dependency sits behind one of these Protocols; adapters in
``stovepipe_fsm.adapters`` implement them (memory, git, file, jetstream). The core never
imports an adapter. Contracts are stated on each Protocol and enforced by the shared
contract test suites in ``tests/contracts``.
"""

from .clock import Clock
from .config import ConfigStore
from .delivery import Delivery
from .publisher import Publisher
from .source_control import SourceControl, SourceControlProvider
from .stores import Counter, QueueStore, RequestStore, UriIndex

__all__ = [
    "Clock",
    "ConfigStore",
    "Counter",
    "Delivery",
    "Publisher",
    "QueueStore",
    "RequestStore",
    "SourceControl",
    "SourceControlProvider",
    "UriIndex",
]
