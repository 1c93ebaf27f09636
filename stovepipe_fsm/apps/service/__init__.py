"""The process stage as a long-running JetStream consumer service, and its operator commands.

- ``runtime``   :class:`Service`: the World of ``simulate``, wired on JetStream instead
- ``connect``   nats connection options (auth, reconnects)
- ``logs``      one JSON object per log line
- ``http``      ``/healthz`` and Prometheus-text ``/metrics`` on loopback
- ``operators`` ``ingest``, ``complete``, ``status`` against the same broker
- ``demo``      the seed's A→F walkthrough on an embedded broker and a real git repository
- ``command``   the CLI subcommands
"""
