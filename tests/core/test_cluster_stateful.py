"""Several learners and closers driven through ``advance`` against the model store.

Hypothesis picks the topology (two closer-capable nodes, or one closer and two
learner-only nodes) and every action — which command lands next (and whether it
fails or loses its response), timers, training, clock, crashes, restarts, poisoned
deltas, garbage dropped into the bucket — and every named invariant is checked
after each one. At the end, progress is asserted without healing what a correct
protocol must survive (see :meth:`ClusterMachine.teardown`). A second group of
tests drives fair schedules and asserts progress in specific scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import hypothesis.strategies as st
import pytest
from fast_cluster import FAST_C, FAST_L, C, L
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gm_core import cluster as cl
from gm_core import keys, learner
from gm_core.commands import Capture, Get, Probe, PutOnce
from gm_core.records import AlgorithmConfig, Alignment, Reason

NAMES = ("n0", "n1", "n2")
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
SINGLE_CLOSER = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
"""Nobody can take a round over: whatever stalls the one closer stalls the run."""
TOPOLOGIES = {"two closers": ROLES, "one closer": SINGLE_CLOSER}


def make(config: AlgorithmConfig, roles: Mapping[str, frozenset[cl.Machine]] = ROLES) -> cl.Cluster:
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in NAMES:
        c = cl.start(c, name)
    return c


configs = st.builds(
    AlgorithmConfig,
    sync_every=st.integers(2, 6),
    fragments=st.integers(1, 2),
    quorum=st.integers(1, 3),
    in_flight=st.integers(1, 2),
    alignment=st.sampled_from(list(Alignment)),
    lease_timeout_s=st.just(4.0),
    takeover_floor_s=st.just(6.0),
)


class ClusterMachine(RuleBasedStateMachine):
    c: cl.Cluster

    @initialize(config=configs, topology=st.sampled_from(sorted(TOPOLOGIES)))
    def setup(self, config: AlgorithmConfig, topology: str) -> None:
        event(f"topology: {topology}")
        self.c = make(config, TOPOLOGIES[topology])

    @precondition(lambda self: bool(self.c.inflight))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.c.inflight) - 1))
        fault = data.draw(
            st.sampled_from([cl.Fault.NONE] * 6 + [cl.Fault.FAIL, cl.Fault.LOSE_RESPONSE])
        )
        self.c = cl.deliver(self.c, index, fault)

    @rule()
    def deliver_all(self) -> None:
        for _ in range(50):
            if not self.c.inflight:
                break
            self.c = cl.deliver(self.c, 0)

    @precondition(lambda self: bool(cl.due_timers(self.c)))
    @rule()
    def fire_timers(self) -> None:
        for name, machine in cl.due_timers(self.c):
            self.c = cl.fire(self.c, name, machine)

    @rule(name=st.sampled_from(NAMES), steps=st.integers(1, 4))
    def train(self, name: str, steps: int) -> None:
        self.c = cl.train(self.c, name, steps)

    @rule(seconds=st.sampled_from([0.25, 1.0, 3.0, 10.0]))
    def tick(self, seconds: float) -> None:
        self.c = cl.tick(self.c, seconds)

    @precondition(lambda self: sum(n.alive for n in self.c.nodes.values()) > 1)
    @rule(name=st.sampled_from(NAMES))
    def crash(self, name: str) -> None:
        self.c = cl.crash(self.c, name)

    @rule(name=st.sampled_from(NAMES))
    def restart(self, name: str) -> None:
        if not self.c.nodes[name].alive:
            self.c = cl.start(self.c, name)

    @rule(name=st.sampled_from(NAMES))
    def poison(self, name: str) -> None:
        self.c = cl.set_poison(self.c, name, True)

    @rule(key=st.sampled_from(["snapshot", "round", "claim", "junk"]), blob=st.binary(max_size=40))
    def hostile_write(self, key: str, blob: bytes) -> None:
        """Garbage dropped into the bucket by hand must be survived, never crash a machine."""
        newest = len(self.c.store.list(keys.ROUNDS_PREFIX))
        target = {
            "snapshot": keys.snapshot(newest, "intruder"),
            "round": keys.round_record(newest + 50),
            "claim": keys.claim(newest, 9000),
            "junk": f"{keys.snapshot_prefix(newest)}not a key",
        }[key]
        self.c = cl.inject(self.c, target, blob)

    @rule(ticks=st.integers(4, 40))
    def run_fairly(self, ticks: int) -> None:
        """A stretch of fair scheduling, so that random runs get deep into the tape."""
        self.c = run_fair(self.c, ticks, check=False)

    @invariant()
    def invariants_hold(self) -> None:
        broken = cl.check(self.c)
        assert not broken, broken

    def teardown(self) -> None:
        """Progress without healing what a correct protocol must survive.

        From here on no request fails and no response is lost (transient store
        faults end), and the cluster is scheduled fairly. Nothing else is healed:
        crashed learners stay dead, poisoned learners stay poisoned, rounds a
        learner gave up (a failed ``Capture``, three failed snapshot writes) stay
        given up, and garbage in snapshot folders, claims and round keys stays
        (slots, protocol.md §16.4). Only what the progress property itself excludes
        is put right: with no closer-capable node up nobody can commit, so one is
        restarted, and an object at a round key can still halt the run by design
        (a record of a newer format, §14.9): if the run has not committed 3 new
        records within 200 fair ticks (50 s), an operator removes the outsiders'
        objects at the rounds the tape has not reached (:func:`cl.clean`), and
        the run must then commit 3 within 200 more. Removing them at once, before
        the run halted, emptied slot 0 below records that later readers then
        never found (a stall hypothesis found: round 50 at slot 1 over garbage
        dropped early at slot 0, two learners stopped at the emptied slot).
        """
        event(f"records committed: {min(len(cl.records(self.c)) // 5 * 5, 20)}+")
        c = self.c
        closers = [n for n in sorted(c.nodes) if C in c.roles[n]]
        if not any(c.nodes[n].alive for n in closers):
            c = cl.start(c, closers[0])
        before = len(cl.records(c))
        c = run_fair(c, 200, check=False)
        if len(cl.records(c)) < before + 3:
            event("halted until an operator removed the garbage at round keys")
            c = cl.clean(c, prefix=keys.ROUNDS_PREFIX)
            before = len(cl.records(c))
            c = run_fair(c, 200, check=False)
        assert not cl.check(c)
        assert len(cl.records(c)) >= before + 3, _stuck(c)


ClusterMachine.TestCase.settings = settings(
    # 30 examples in the default (ci) profile, 500 under GM_HYPOTHESIS_PROFILE=long.
    max_examples=max(30, settings.default.max_examples // 4),
    stateful_step_count=50,
    deadline=None,
)
TestClusterStateful = ClusterMachine.TestCase


MAX_DELIVERIES_PER_TICK = 500
"""Far more than a tick needs: a machine answering every outcome with a request livelocks."""


def _describe(c: cl.Cluster) -> str:
    """The commands going round in circles, with what each machine wanted them for."""
    out = []
    for item in c.inflight[:4]:
        node = c.nodes[item.node]
        state = node.closer if item.machine is cl.Machine.CLOSER else node.learner
        req = getattr(item.command, "req", None)
        purpose = state.pending.get(req) if state is not None and req is not None else None
        phase = state.phase if state is not None else None
        out.append(f"{item.node}/{item.machine} {phase} {item.command!r} for {purpose!r}")
    return "; ".join(out)


def no_faults(item: cl.InFlight) -> cl.Fault:
    return cl.Fault.NONE


def run_fair(
    c: cl.Cluster,
    ticks: int,
    *,
    dt: float = 0.25,
    check: bool = True,
    fault: Callable[[cl.InFlight], cl.Fault] = no_faults,
) -> cl.Cluster:
    """A fair schedule: everything in flight lands (with the ``fault`` it picks for each
    command, normally none), timers fire, everyone trains a step."""
    for _ in range(ticks):
        for delivered in range(MAX_DELIVERIES_PER_TICK + 1):
            if not c.inflight:
                break
            assert delivered < MAX_DELIVERIES_PER_TICK, f"livelock: {_describe(c)}"
            c = cl.deliver(c, 0, fault(c.inflight[0]))
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(c.nodes):
            c = cl.train(c, name, 1)
        c = cl.tick(c, dt)
        if check:
            assert not cl.check(c), cl.check(c)
    return c


def _stuck(c: cl.Cluster) -> str:
    """Where a run that stopped committing stands: each live machine's phase and round."""
    out = [f"stuck at {len(cl.records(c))} records, t={c.now_s:g}s"]
    for name, node in sorted(c.nodes.items()):
        if not node.alive:
            out.append(f"{name}: dead")
            continue
        if node.closer is not None:
            state = node.closer
            entries = {e.learner: str(e.stage) for e in state.entries.values()}
            out.append(
                f"{name} closer: {state.phase} round {state.round}, entries {entries},"
                f" leases {sorted(state.leases)}, dead {sorted(state.dead)}"
            )
        if node.learner is not None:
            lrn = node.learner
            out.append(
                f"{name} learner: {lrn.phase} aligned {lrn.aligned_round} next {lrn.next_round}"
                f" outgoing {sorted(lrn.outgoing)} poison {node.poison}"
            )
    return "\n".join(out)


def participants(c: cl.Cluster) -> list[int]:
    return [len(r.participants) for r in cl.records(c)]


def test_fair_schedule_commits_every_round_with_everyone() -> None:
    c = run_fair(make(AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1)), 200)
    counts = participants(c)
    assert len(counts) >= 10
    assert all(n == 3 for n in counts), counts


@pytest.mark.parametrize("how", ["capture fails", "three snapshot writes fail"])
def test_a_learner_that_gives_up_a_round_does_not_stall_a_single_closer(how: str) -> None:
    """protocol.md §15.2: n2 gives round 5 up but stays live; quorum 3 needs it or
    needs the closer to stop waiting for it. With one closer-capable node there is
    no takeover to fall back on, so the closer itself must close the round, within a
    few lease timeouts (4 s here; the run is given 50 s)."""
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1, lease_timeout_s=4.0)
    gave_up = keys.snapshot(5, "n2")

    def fault(item: cl.InFlight) -> cl.Fault:
        cmd = item.command
        if how == "capture fails" and isinstance(cmd, Capture):
            hit = (item.node, cmd.round) == ("n2", 5)
        else:
            hit = isinstance(cmd, PutOnce) and cmd.key == gave_up
        return cl.Fault.FAIL if hit else cl.Fault.NONE

    c = run_fair(make(config, SINGLE_CLOSER), 200, fault=fault)
    assert c.store.get(gave_up) is None  # n2 did give round 5 up
    records = cl.records(c)
    assert len(records) >= 10, _stuck(c)
    assert "n2" not in {p.learner for p in records[5].participants}
    assert all(len(r.participants) == 3 for r in records[8:]), participants(c)


def test_crashed_closer_is_taken_over_through_a_claim() -> None:
    config = AlgorithmConfig(
        sync_every=8, fragments=2, quorum=1, in_flight=1, lease_timeout_s=4.0, takeover_floor_s=6.0
    )
    c = run_fair(make(config), 60)
    before = len(cl.records(c))
    c = cl.crash(c, "n0")
    c = run_fair(c, 200)
    records = cl.records(c)
    assert len(records) > before + 5
    taken = [r for r in records if r.closer == "n1" and r.claim > 0]
    assert taken, "n1 never took over"
    assert all(r.closer == "n1" for r in records[before + 1 :])


def test_poisoned_learner_is_rejected_by_name_and_the_run_goes_on() -> None:
    c = make(AlgorithmConfig(sync_every=8, fragments=2, quorum=2, in_flight=1))
    c = cl.set_poison(c, "n2", True)
    c = run_fair(c, 150)
    records = cl.records(c)
    assert len(records) >= 8
    assert all("n2" not in {p.learner for p in r.participants} for r in records)
    assert any(
        (x.learner, x.reason) == ("n2", Reason.NONFINITE) for r in records for x in r.rejections
    )


@pytest.mark.parametrize("sync_every", [4, 5])
def test_a_poisoned_learner_does_not_stall_a_single_closer(sync_every: int) -> None:
    """n2's deltas are all non-finite and nobody un-poisons it. With quorum 3 the one
    closer waits for n2's verdict every round (``nonfinite``), so n2 must keep
    publishing every round, in flight 2 as well, or stop being waited for."""
    config = AlgorithmConfig(
        sync_every=sync_every, fragments=2, quorum=3, in_flight=2, lease_timeout_s=4.0
    )
    c = run_fair(cl.set_poison(make(config, SINGLE_CLOSER), "n2", True), 200)
    records = cl.records(c)
    assert len(records) >= 30, _stuck(c)
    assert all("n2" not in {p.learner for p in r.participants} for r in records)


def test_dead_learner_is_waited_for_at_most_the_lease_timeout() -> None:
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1, lease_timeout_s=4.0)
    c = run_fair(make(config), 60)
    before = len(cl.records(c))
    c = cl.crash(c, "n2")
    c = run_fair(c, 120)
    after = cl.records(c)[before:]
    assert len(after) >= 5
    assert all(len(r.participants) == 2 for r in after[2:])


def test_learner_joining_mid_run_catches_up_and_participates() -> None:
    c = cl.create(
        AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=1),
        ROLES,
        learner_options=FAST_L,
        closer_options=FAST_C,
    )
    c = cl.start(cl.start(c, "n0"), "n1")
    c = run_fair(c, 80)
    joined_at = len(cl.records(c))
    c = run_fair(cl.start(c, "n2"), 80)
    later = cl.records(c)[joined_at + 2 :]
    assert any("n2" in {p.learner for p in r.participants} for r in later)
    assert c.nodes["n2"].learner is not None
    assert c.nodes["n2"].learner.aligned_round >= joined_at


def test_clean_close_flushes_and_releases_the_lease() -> None:
    c = run_fair(make(AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=1)), 60)
    c = cl.close(c, "n2")
    c = run_fair(c, 80)
    node = c.nodes["n2"]
    assert node.learner is not None
    assert node.learner.phase is learner.Phase.CLOSED
    assert c.store.get(keys.lease("n2")) is None
    finals = [p for r in cl.records(c) for p in r.participants if p.final]
    assert finals
    assert all(p.learner == "n2" for p in finals)


def test_a_dead_learners_lease_is_read_once_per_lease_timeout_not_every_probe() -> None:
    """A crashed node's lease stays in the bucket: the leader stops probing it once a
    probe finds it stale, and reads it only when it lists the leases (once a timeout)."""
    timeout_s, dt = 4.0, 0.25
    config = AlgorithmConfig(
        sync_every=8, fragments=2, quorum=1, in_flight=1, lease_timeout_s=timeout_s
    )
    c = run_fair(make(config), 60, dt=dt)
    c = cl.crash(c, "n2")
    c = run_fair(c, 40, dt=dt)  # long enough for every closer to find n2 dead
    looks: set[tuple[str, int]] = set()
    ticks = 240
    for _ in range(ticks):
        for f in c.inflight:
            if isinstance(f.command, Get | Probe) and f.command.key == keys.lease("n2"):
                looks.add((f.node, f.command.req))
        c = run_fair(c, 1, dt=dt)
    seconds = ticks * dt
    leaders = {r.closer for r in cl.records(c)[-ticks // 8 :]}
    assert len(cl.records(c)) > 40  # the run goes on without n2
    # Each closer that led: one lease read per listing (every timeout), plus slack for
    # a change of leader; probing every renew/2 (FAST_C: 0.5 s) would be ~4 per second.
    assert len(looks) <= len(leaders) * (seconds / timeout_s + 2), (len(looks), leaders)


def test_an_operators_clean_leaves_the_garbage_under_a_record() -> None:
    """``cluster.clean`` (the teardown's operator) removes outsiders' objects at rounds the
    tape has not reached, and leaves one at a round whose record was written at a slot
    above it (emptying that slot would stop there every reader that had not read the round
    yet: "not yet", protocol.md §16.4.2; the stall hypothesis found when the teardown
    removed it); and the run goes on, a learner restarted from the tape included."""
    c = make(AlgorithmConfig(sync_every=4, fragments=2, quorum=2, in_flight=2))
    under, ahead = keys.round_record(2), keys.round_record(500)
    c = cl.inject(cl.inject(c, under, b"garbage"), ahead, b"garbage")
    c = run_fair(c, 120)
    assert len(cl.records(c)) > 3
    c = cl.clean(c, prefix=keys.ROUNDS_PREFIX)
    assert c.store.get(under) is not None
    assert c.store.get(ahead) is None
    before = len(cl.records(c))
    c = cl.start(cl.crash(c, "n2"), "n2")  # a learner that reads the tape afresh
    c = run_fair(c, 120)
    assert len(cl.records(c)) >= before + 3, _stuck(c)
