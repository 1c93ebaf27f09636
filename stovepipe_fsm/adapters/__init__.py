"""Adapters: the I/O behind the ports in ``stovepipe_fsm.ports``.

Each subpackage implements some of the Protocols for one kind of backend:

- ``memory``     in-process, deterministic implementations for unit tests, ``simulate``
                 and ``check`` (every store can be cloned so a model checker can fork
                 the whole world state);
- ``git``        source control answered by a local git repository;
- ``file``, ``jetstream``  configuration files and the NATS JetStream runtime.

This package deliberately imports none of them: the core never depends on an adapter,
and choosing one (with its third-party imports) is the job of the application wiring.
The contract each port promises, and which adapters keep it, is in ``README.md`` here.
"""
