"""The deterministic simulator: real learner and closer machines on a virtual clock.

Theory of operation
-------------------
A :class:`~gm_core.sim.scenario.Scenario` names a fleet, a store, speeds, faults
and optionally a small model that really trains; :func:`~gm_core.sim.world.run`
drives the very ``advance`` functions the shell runs through
:mod:`gm_core.cluster`, on a virtual clock, from one seed, checking the named
invariants after every action, and returns a :class:`~gm_core.sim.world.Report`
(goodput, uptime, rounds per hour, participants, staleness, requests and their
cost, the loss curve, and a trace hash that the same seed reproduces). The
paper's goodput table comes from :mod:`gm_core.sim.chaos`; random swarms of
small scenarios from :mod:`gm_core.sim.swarm`.
"""
