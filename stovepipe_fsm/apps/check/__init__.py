"""``stovepipe-fsm check``: exhaustive exploration of the shipped policy.

The checker does not re-model the process stage. It drives the real controller, ingest,
record and dead-letter reconciler through :class:`~..simulate.world.World` (in-memory
adapters, a simulated clock and a simulated per-queue process topic) and enumerates
every interleaving of a bounded set of environment actions breadth-first, hashing world
states so each one is expanded once. Every action is a timeline step, so any path the
search takes can be written out and replayed by ``stovepipe-fsm simulate``.

Modules:

- :mod:`.model` - bounds, the per-path budget of bounded actions, labelled actions;
- :mod:`.observe` - what of a world is hashed (the clock abstracted to relative times);
- :mod:`.invariants` - the properties checked in every state and on every edge, and
  the :class:`~.invariants.Proof` of the ones a policy declares;
- :mod:`.actions` - which actions a state enables, and applying one to a forked world;
- :mod:`.variants` - the seed's bare in-flight counter, to show why holders exist;
- :mod:`.explorer` - the breadth-first search and the liveness pass over its graph;
- :mod:`.trace` - counterexamples as timeline files, and their replay;
- :mod:`.command` - the CLI.
"""
