"""Per-queue policy: ``config/queues.yaml`` loaded, validated and resolved per queue name.

The pipeline never writes this configuration; it reads it at decision time through the
``ConfigStore`` port (file-backed with hot reload in ``adapters/file``, static in
``adapters/memory``). See ``docs/config.md`` for the format and precedence rules.
"""
