"""A whole pipeline on in-memory adapters and a simulated clock.

:mod:`.world` runs the real stages (wired by the same factory as the service) against
in-memory stores and a simulated process topic (:mod:`.runtime`); :mod:`.timeline`
loads the timeline files ``simulate`` replays, :mod:`.expectations` evaluates their
``expect:`` steps and :mod:`.replay` replays them. The ``simulate``, ``test`` and
``check`` commands are all built on it.
"""
