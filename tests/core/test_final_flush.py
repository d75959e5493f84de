"""A closing learner's final snapshot that lands after its round closed is flushed again.

bench_queue (issue 13) found the run's final commit short of trained steps: with a short
fixed grace window, a learner whose data ran out published its final (flush-on-close)
snapshot a few milliseconds after the closer had closed the round without it, and
nothing published those steps again: under ``carry`` a late snapshot's steps go into the
learner's next snapshot of the fragment, and a closing learner has none. 8–32 of 384
steps per fragment were missing from the final model in 3 of 5 queue runs (the nodes all
close together there). Replayed on the model cluster: the final snapshots of the learner
are held in flight until their round's record is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fast_cluster import FAST_C, FAST_L, C, L

from gm_core import cluster as cl
from gm_core import keys, learner
from gm_core.commands import PutOnce
from gm_core.records import AlgorithmConfig, Alignment

CONFIG = AlgorithmConfig(
    sync_every=8,
    fragments=2,
    quorum=1,
    in_flight=2,
    alignment=Alignment.CARRY,
    grace_seconds=0.1,
    lease_timeout_s=4.0,
)
ROLES = {"n0": frozenset({C}), "n1": frozenset({L}), "n2": frozenset({L})}
"""A closer of its own: the learners' closing leaves it serving, as a closing ``Session``
leaves its node's closer serving until the run is finished."""
Hold = Callable[[cl.Cluster, cl.InFlight], bool]


def run(c: cl.Cluster, seconds: float, hold: Hold = lambda c, item: False) -> cl.Cluster:
    """Every node trains a step per 0.25 s; requests complete in order, except those ``hold``
    keeps in flight for now."""
    end_s = c.now_s + seconds
    while c.now_s < end_s:
        ready = [i for i, item in enumerate(c.inflight) if not hold(c, item)]
        while ready:
            c = cl.deliver(c, ready[0])
            ready = [i for i, item in enumerate(c.inflight) if not hold(c, item)]
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(ROLES):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
        assert not cl.check(c), cl.check(c)
    return c


def late_finals(c: cl.Cluster, late: Iterable[str], rounds: dict[str, range]) -> Hold:
    """Hold the snapshots each ``late`` learner writes in the second after closing, of its
    flush rounds, until the round's record is written: they land after their round closed
    without them."""
    names, closed_s = frozenset(late), c.now_s
    issued: dict[cl.InFlight, float] = {}

    def hold(c: cl.Cluster, item: cl.InFlight) -> bool:
        cmd = item.command
        if item.node not in names or not isinstance(cmd, PutOnce):
            return False
        if not cmd.key.startswith(keys.SNAPSHOTS_PREFIX):
            return False
        round_ = int(cmd.key.split("/")[1])
        flushed = issued.setdefault(item, c.now_s) <= closed_s + 1.0
        return flushed and round_ in rounds[item.node] and len(cl.records(c)) <= round_

    return hold


def close_late(c: cl.Cluster, closing: list[str], late: list[str]) -> tuple[cl.Cluster, Hold]:
    """Close ``closing`` now, the final snapshots of those ``late`` to land late (a
    snapshot of another learner makes quorum, and the grace window closes the round)."""
    flushes = {}
    for name in closing:
        state = c.nodes[name].learner
        assert state is not None
        flushes[name] = range(state.next_round, state.next_round + CONFIG.fragments)
        c = cl.close(c, name)
    return c, late_finals(c, late, flushes)


def merged_steps(c: cl.Cluster, name: str) -> list[int]:
    """Per fragment, the steps of ``name``'s snapshots the tape merged."""
    tape = cl.records(c)
    return [
        sum(p.steps for r in tape if r.fragment == f for p in r.participants if p.learner == name)
        for f in range(CONFIG.fragments)
    ]


def test_a_late_final_snapshot_is_flushed_again_while_others_train() -> None:
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    c = run(c, 20.0)
    c, hold = close_late(c, ["n1"], late=["n1"])  # n2 trains on
    c = run(c, 20.0, hold)
    state = c.nodes["n1"].learner
    assert state is not None
    assert state.phase is learner.Phase.CLOSED
    assert merged_steps(c, "n1") == [c.nodes["n1"].step] * CONFIG.fragments


def test_late_final_snapshots_are_flushed_again_when_every_learner_closes() -> None:
    """The end of a queue: every learner closes at once, so no training learner publishes
    the rounds after the flush (n2's finals make quorum, n1's land late)."""
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    c = run(c, 20.0)
    c, hold = close_late(c, ["n1", "n2"], late=["n1"])
    c = run(c, 20.0, hold)
    for name in ("n1", "n2"):
        state = c.nodes[name].learner
        assert state is not None
        assert state.phase is learner.Phase.CLOSED
        assert merged_steps(c, name) == [c.nodes[name].step] * CONFIG.fragments, name
