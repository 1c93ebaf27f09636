"""stovepipe-fsm: the process stage of a post-merge trunk-validation pipeline.

Layers (see docs/architecture.md):

- ``spec``      declarative policy: YAML loading with source locations, JSON Schema,
                lint, the ``transitions`` compiler and diagrams.
- ``config``    per-queue policy (``config/queues.yaml``) and queue-name rules.
- ``domain``    Request, Queue, QueueConfig, request ids, hook events, errors.
- ``ports``     the Protocols the core talks to.
- ``process``   the process stage and its collaborators, driven by compiled machines.
- ``adapters``  memory | git | file | jetstream implementations of the ports.
- ``apps``      command-line entry points: validate, diagram, simulate, check, serve ...
"""

__version__ = "0.1.0"
