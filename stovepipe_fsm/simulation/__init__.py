"""A whole pipeline on in-memory adapters and a simulated clock.

:mod:`.world` runs the real stages (wired by the same factory as the service) against
in-memory stores and a simulated process topic (:mod:`.broker`); :mod:`.timeline`
loads the timeline files ``simulate`` replays, :mod:`.expectations` evaluates their
``expect:`` steps and :mod:`.replay` replays them; :mod:`.timed` replays one and times
every request on its clock. The ``simulate``, ``whatif``, ``test`` and ``check`` commands
are all built on it.
"""
