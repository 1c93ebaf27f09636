"""The process stage as a long-running JetStream consumer service, and its operator commands.

- ``supervisor``      :class:`Service`: the World of ``simulate``, wired on JetStream
  instead; a supervisor of the collaborators below
- ``broker_pipeline`` the stages on one broker's stores
- ``service_options`` a service's waits, intervals and concurrency
- ``policy_watch``    the policy and operator pauses in force, reloaded and recorded
- ``queue_consumers`` one consumer per queue, on its partition (``placement``)
- ``discovery``       the queues to serve, and orphan messages
- ``wakeups``         plain subscriptions and reconnects that renew parked pull requests
- ``health``          heartbeat, health check, runtime events
- ``tasks``           a service's loops, chores and stop signal
- ``connect``         nats connection options (auth, seed lists, reconnects)
- ``keepalive``       the heartbeat that keeps a long step's ack deadline ahead of it
- ``bounded_http``    the HTTP server both endpoints run on, bounded per client
- ``http``            ``/healthz`` and Prometheus-text ``/metrics`` on loopback
- ``poll``            every commit pushed to git refs, from a cursor per ref (shared
  with ``webhook``: ``adapters.jetstream.ref_cursors``)
- ``webhook``         GitHub and GitLab push events (``push_events``, ``rate_limit``;
  late pushes told by ``push_order``; the command too)
- ``operators``       ``ingest``, ``complete``, ``status``, ``explain`` against the broker
- ``pauses``, ``verbs``, ``dlq``  ``pause``/``resume``, ``cancel``/``retry``, ``dlq``
- ``demo``            the seed's A→F walkthrough on an embedded broker and a real git
  repository
- ``arguments``       what the command lines name (broker, topology, durations, sizes)
- ``command``         the CLI subcommands; ``serve`` logs one JSON object per line
"""
