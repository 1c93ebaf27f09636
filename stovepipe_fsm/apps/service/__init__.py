"""The process stage as a long-running JetStream consumer service, and its operator commands.

- ``supervisor``      :class:`Service`: the World of ``simulate``, wired on JetStream
  instead; a supervisor of the collaborators below
- ``broker_pipeline`` the stages on one broker's stores
- ``service_options`` a service's waits, intervals and concurrency
- ``policy``          the policy in force, and how an edit is taken up without a restart
- ``policy_watch``    the policy and operator pauses in force, reloaded and recorded
- ``queue_consumers`` one consumer per queue, on its partition (``placement``)
- ``discovery``       the queues to serve, and orphan messages
- ``unpublished``     accepted heads with no process message, published again
- ``wakeups``         plain subscriptions and reconnects that renew parked pull requests
- ``health``          heartbeat, health check, runtime events
- ``tasks``           a service's loops, chores and stop signal
- ``connect``         nats connection options (auth, seed lists, reconnects)
- ``secrets``         where NATS credentials come from, kept out of what is printed
- ``keepalive``       the heartbeat that keeps a long step's ack deadline ahead of it
- ``bounded_http``    the HTTP server both endpoints run on, bounded per client
- ``http``            ``/healthz`` and Prometheus-text ``/metrics`` on loopback
- ``poll``            every commit pushed to git refs, from a cursor per ref (shared
  with ``webhook``: ``adapters.jetstream.ref_cursors``)
- ``webhook``         GitHub and GitLab push events (``push_events``, ``rate_limit``;
  late pushes told by ``push_order``; the command too)
- ``operators``       ``ingest``, ``complete``, ``status``, ``explain`` against the broker
- ``status_page``     what the status page reads from the broker
- ``export``          a deployment's recorded run as a timeline (``recorded_run``)
- ``pauses``, ``verbs``, ``dlq``  ``pause``/``resume``, ``cancel``/``retry``, ``dlq``
- ``demo``            the seed's A→F walkthrough on an embedded broker and a real git
  repository
- ``arguments``       what the command lines name (broker, topology, durations, sizes)
- ``command``         the CLI subcommands; ``serve`` logs one JSON object per line
"""
