"""The process stage as a long-running JetStream consumer service, and its operator commands.

- ``runtime``   :class:`Service`: the World of ``simulate``, wired on JetStream instead
- ``connect``   nats connection options (auth, seed lists, reconnects)
- ``keepalive`` the heartbeat that keeps a long step's ack deadline ahead of it
- ``durations`` ages and waits on the command line (``7d``, ``10s``)
- ``logs``      one JSON object per log line
- ``http``      ``/healthz`` and Prometheus-text ``/metrics`` on loopback
- ``operators`` ``ingest``, ``complete``, ``status`` against the same broker (``prune`` is
  in ``command``, on ``adapters/jetstream/prune``)
- ``demo``      the seed's A→F walkthrough on an embedded broker and a real git repository
- ``command``   the CLI subcommands
"""
