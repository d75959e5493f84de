"""Regression tests for protocol defects the simulator found (each has a "core fix:" commit)."""

from __future__ import annotations

import pytest

from gm_core import closer, keys
from gm_core import cluster as cl
from gm_core.commands import Command, Get, WakeAt
from gm_core.events import RequestFailed, Started, TimerFired
from gm_core.records import AlgorithmConfig

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER


def _wakes(cmds: list[Command]) -> list[float]:
    return [c.at_s for c in cmds if isinstance(c, WakeAt)]


@pytest.mark.parametrize("write_lease", [True, False])
def test_closer_does_not_busy_wake_while_its_poll_is_in_flight(write_lease: bool) -> None:
    """Found by the simulator: a closer whose poll request was in flight asked to be
    woken at a deadline already past; each wake found nothing to do and asked again,
    so a shell would spin until the response came (thousands of wakes per round).
    """
    c = cl.create(AlgorithmConfig(sync_every=4, fragments=1), {"n0": frozenset({C})})
    options = closer.CloserOptions(write_lease=write_lease)
    state = closer.initial("n0", c.manifest, c.schema_digest, options)
    state, cmds = closer.advance(state, Started(now_s=0.0))
    for now in (0.0, 0.5):
        state, cmds = closer.advance(state, TimerFired(now_s=now))
        assert all(at > now for at in _wakes(cmds)), (now, _wakes(cmds))


def test_collecting_closer_without_known_leases_does_not_busy_wake() -> None:
    """Found by the simulator: while collecting with no learner lease known yet, the
    lease-probe deadline stayed in the past and the closer asked to be woken at it."""
    c = cl.create(AlgorithmConfig(sync_every=4, fragments=1), {"n0": frozenset({C})})
    c = cl.start(c, "n0")
    while c.inflight:  # head and tape probes: nothing there, so the closer opens round 0
        c = cl.deliver(c, 0)
        node = c.nodes["n0"]
        assert node.closer is not None
        if node.closer.phase is closer.Phase.COLLECTING:
            break
    state = c.nodes["n0"].closer
    assert state is not None
    assert state.phase is closer.Phase.COLLECTING
    for now in (0.01, 0.02):
        state, cmds = closer.advance(state, TimerFired(now_s=now))
        assert all(at > now for at in _wakes(cmds)), (now, _wakes(cmds))


def test_closer_boots_after_its_head_read_fails() -> None:
    """Found by the model checker (one node, one fault): the first read of the head hint
    failed and the closer, still without a round to probe, never read the tape again —
    booting wedged for good and no round ever committed. Without the hint it now probes
    the tape from its start.
    """
    c = cl.create(AlgorithmConfig(sync_every=4, fragments=1), {"n0": frozenset({C})})
    state = closer.initial("n0", c.manifest, c.schema_digest)
    state, cmds = closer.advance(state, Started(now_s=0.0))
    head = next(x for x in cmds if isinstance(x, Get) and x.key == keys.head())
    state, cmds = closer.advance(state, RequestFailed(now_s=0.0, req=head.req, error="injected"))
    reads: list[str] = []
    for now in (1.0, 2.0, 3.0):
        state, cmds = closer.advance(state, TimerFired(now_s=now))
        reads.extend(x.key for x in cmds if isinstance(x, Get))
    assert keys.round_record(0) in reads, reads
