"""A node's two machines tell each other of their own writes (``Share``/``Shared``).

Between the learner and the closer of one node the store's poll was the only messenger:
the closer learned of its own learner's snapshot by listing the round's folder and
reading the key, the learner of its own closer's record by probing the record key, up to
a poll interval each (bench_step: a due step waiting at ``in_flight`` for the record).
These tests drive the model cluster, whose harness feeds a ``Share`` to the node's other
machine within the same action, as the shell does in the same turn of its loop.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
from fast_cluster import FAST_C, FAST_L, random_step

from gm_core import closer, keys, learner
from gm_core import cluster as cl
from gm_core.closer import Phase, Stage
from gm_core.closer import collect as closer_collect
from gm_core.closer.state import Listing
from gm_core.commands import Get, List, Merge, PutOnce, Share
from gm_core.events import GotObject, PutDone, Shared
from gm_core.learner.state import Ask
from gm_core.records import AlgorithmConfig
from gm_core.requests import Purpose

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
SOLO = {"n0": frozenset({L, C})}


def solo(in_flight: int) -> cl.Cluster:
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=in_flight)
    c = cl.create(config, SOLO, learner_options=FAST_L, closer_options=FAST_C)
    return cl.start(c, "n0")


def deliver_until(
    c: cl.Cluster,
    done: Callable[[cl.InFlight], bool],
    hold: Callable[[cl.InFlight], bool] = lambda _: False,
) -> cl.Cluster:
    """Deliver in order (what ``hold`` matches stays in flight), timers and training between,
    until an item ``done`` is delivered."""
    return delivered(c, done, hold)[0]


def delivered(
    c: cl.Cluster,
    done: Callable[[cl.InFlight], bool],
    hold: Callable[[cl.InFlight], bool] = lambda _: False,
) -> tuple[cl.Cluster, str]:
    """:func:`deliver_until`, and the key the item ``done`` wrote."""
    for _ in range(2000):
        ready = [i for i, f in enumerate(c.inflight) if not hold(f)]
        if ready:
            item = c.inflight[ready[0]]
            c = cl.deliver(c, ready[0])
            if done(item):
                assert isinstance(item.command, PutOnce)
                return c, item.command.key
            continue
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        c = cl.train(c, "n0", 1)
        c = cl.tick(c, 0.05)
    raise AssertionError("never delivered")


def writes(prefix: str, machine: cl.Machine) -> Callable[[cl.InFlight], bool]:
    def done(item: cl.InFlight) -> bool:
        cmd = item.command
        return item.machine is machine and isinstance(cmd, PutOnce) and cmd.key.startswith(prefix)

    return done


def merging(item: cl.InFlight) -> bool:
    return isinstance(item.command, Merge)


def lists(c: cl.Cluster, round_: int) -> int:
    """Listings of ``round_``'s snapshot folder still in flight."""
    prefix = keys.snapshot_prefix(round_)
    return sum(isinstance(f.command, List) and f.command.prefix == prefix for f in c.inflight)


def test_the_closer_judges_its_own_learners_snapshot_as_it_lands() -> None:
    c, key = delivered(solo(1), writes(keys.SNAPSHOTS_PREFIX, L))
    state = c.nodes["n0"].closer
    assert state is not None
    parsed = keys.parse(key)
    assert isinstance(parsed, keys.SnapshotKey)
    round_ = parsed.round
    if state.phase is Phase.COLLECTING and state.round == round_:
        entry = state.entries["n0"]
        assert entry.stage is Stage.VERIFYING  # no listing, no read of the key
    else:  # told before its round opened: kept for it
        assert [h[0] for h in state.heard] == [round_]
    assert not cl.check(c)


def test_the_learner_adopts_its_own_closers_record_as_it_lands() -> None:
    c = deliver_until(solo(1), writes(keys.ROUNDS_PREFIX, C))
    state = c.nodes["n0"].learner
    assert state is not None
    assert state.seen_round == 0  # no probe delivered since the write
    assert 0 in state.fetched or state.aligned_round == 0 or state.aligning == 0
    c = deliver_until(c, writes(keys.ROUNDS_PREFIX + "000000000003", C))
    assert not cl.check(c)
    assert [r.round for r in cl.records(c)] == [0, 1, 2, 3]


def first_write(prefix: str, machine: cl.Machine) -> tuple[cl.Cluster, PutOnce]:
    """A node alone, run in order until ``machine``'s first write under ``prefix`` is in flight
    (not yet delivered), and that write."""
    c = solo(1)
    for _ in range(2000):
        writing = [f.command for f in c.inflight if writes(prefix, machine)(f)]
        if writing:
            assert isinstance(writing[0], PutOnce)
            return c, writing[0]
        c = cl.deliver(c, 0) if c.inflight else cl.tick(cl.train(c, "n0", 1), 0.05)
    raise AssertionError("never written")


def test_the_closer_tells_its_learner_the_record_bytes_it_wrote_not_a_second_packing() -> None:
    """The ``Share`` of a landed record carries the very bytes of its write (a keyed run's
    seal is an HMAC over the canonical encoding: packing it again cost ~30 µs a round)."""
    c, write = first_write(keys.ROUNDS_PREFIX, C)
    state = c.nodes["n0"].closer
    assert state is not None
    assert state.sealed is not None
    _, cmds = closer.advance(state, PutDone(now_s=c.now_s, req=write.req, created=True))
    (share,) = [x for x in cmds if isinstance(x, Share)]
    assert share.key == write.key
    assert share.data is write.data


def test_the_learner_tells_its_closer_the_snapshot_bytes_it_wrote_not_a_second_packing() -> None:
    c, write = first_write(keys.SNAPSHOTS_PREFIX, L)
    state = c.nodes["n0"].learner
    assert state is not None
    after, cmds = learner.advance(state, PutDone(now_s=c.now_s, req=write.req, created=True))
    (share,) = [x for x in cmds if isinstance(x, Share)]
    assert share.key == write.key
    assert share.data is write.data
    assert all(out.sealed is None for out in after.outgoing.values() if out.published)


def test_a_snapshot_of_a_round_not_open_yet_is_judged_when_it_opens() -> None:
    """With ``in_flight`` 2 a learner publishes round r + 1 while r is being merged: its
    closer keeps the snapshot and judges it on opening r + 1, before any listing."""
    c = deliver_until(solo(2), writes(keys.ROUNDS_PREFIX, C))  # round 0 is in
    c = deliver_until(c, writes(keys.snapshot_prefix(2), L), hold=merging)
    state = c.nodes["n0"].closer
    assert state is not None
    assert (state.round, state.phase) == (1, Phase.MERGING)
    assert [h[0] for h in state.heard] == [2]
    kept = 2
    c = deliver_until(c, writes(keys.ROUNDS_PREFIX + f"{kept - 1:012d}", C))
    state = c.nodes["n0"].closer
    assert state is not None
    assert (state.round, state.phase) == (kept, Phase.COLLECTING)
    assert state.entries["n0"].stage is Stage.VERIFYING
    assert state.heard == ()
    assert lists(c, kept) == 1  # the listing that opens the round is still in flight
    assert not cl.check(c)


def test_a_probe_of_a_round_heard_of_meanwhile_changes_nothing() -> None:
    c = solo(1)
    c = deliver_until(c, writes(keys.ROUNDS_PREFIX, C))
    record_key = next(k for k in c.store.objects if k.startswith(keys.ROUNDS_PREFIX))
    data = c.store.objects[record_key].data
    before = c.nodes["n0"].learner
    assert before is not None
    # A probe of round 0 that was in flight when the record was heard of comes back.
    req = max(before.pending, default=0) + 1
    pending = {**before.pending, req: Purpose(kind=Ask.RECORD, round=0, name="0")}
    state = attrs.evolve(before, pending=pending, probing=True)
    after, cmds = learner.advance(state, GotObject(now_s=c.now_s, req=req, data=data, etag="e"))
    assert after.seen_round == before.seen_round
    assert after.fetched == before.fetched
    assert not after.probing or any(isinstance(x, Get) for x in cmds)
    # Heard twice: the second time is not the next round's record any more.
    again, _ = learner.advance(before, Shared(now_s=c.now_s, key=record_key, data=data))
    assert again.fetched == before.fetched
    assert again.seen_round == before.seen_round


def test_with_another_learner_live_the_poll_paces_both() -> None:
    """The closer tells its learner nothing while another learner is live: told at once,
    its own learner would run ahead of the other and leave it behind (``collect.alone``)."""
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=1)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    c = cl.start(cl.start(c, "n0"), "n1")
    rng = random.Random(1)
    for _ in range(3000):
        state = c.nodes["n0"].closer
        assert state is not None
        if "n1" in closer_collect.commit._live(state, c.now_s):
            break
        c = random_step(c, rng, ["n0", "n1"])
    else:
        raise AssertionError("n1 never seen live")
    c, key = delivered(c, writes(keys.ROUNDS_PREFIX, C))
    parsed = keys.parse(key)
    assert isinstance(parsed, keys.RoundKey)
    state = c.nodes["n0"].learner
    assert state is not None
    assert state.seen_round < parsed.round  # left to its probe
    assert not cl.check(c)


def test_a_node_alone_waits_for_a_learner_whose_lease_appeared() -> None:
    """A node alone closes a round on hearing of its learner's snapshot only after listings
    of the round's snapshots and of the leases, issued since, have come back and the leases
    found are read (``CloserState.listing``, ``discovery``). Otherwise it runs ahead of a
    learner that joins: that one's snapshots land only in rounds already closed, which no
    listing of an open round shows, and the leases are listed once per lease timeout; it
    never took part (tests/runtime/test_leaving.py in the fresh-clone CI of 19e1ffd).

    Here the newcomer's lease is in the store and it trains no step: with quorum 2, at most
    the round whose listings were already back closes without it; then the node waits."""
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    config = AlgorithmConfig(
        sync_every=8, fragments=2, quorum=2, in_flight=1, lease_timeout_s=600.0
    )
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    c = deliver_until(cl.start(c, "n0"), writes(keys.ROUNDS_PREFIX + "000000000002", C))
    c = cl.start(c, "n1")
    lease = keys.lease("n1")
    for _ in range(200):
        if lease in c.store.objects:
            break
        c = cl.deliver(c, next(i for i, f in enumerate(c.inflight) if f.node == "n1"))
    else:
        raise AssertionError("n1 never wrote its lease")
    before = len(cl.records(c))
    for _ in range(400):  # n0 trains and its requests come back; n1's timers fire
        while c.inflight:
            c = cl.deliver(c, 0)
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        c = cl.train(c, "n0", 1)
        c = cl.tick(c, 0.05)
    assert not cl.check(c)
    closed = [(r.round, [p.learner for p in r.participants]) for r in cl.records(c)[before:]]
    assert len(closed) <= 1, closed


def test_a_failed_lease_listing_is_retried_with_the_next_poll() -> None:
    """The round a node alone closes on its learner's snapshot waits for a lease listing
    (``discovery``); when that listing fails, it is issued again with the closer's next
    poll, not a lease timeout later (here 600 s: the round would sit that long)."""
    config = AlgorithmConfig(
        sync_every=8, fragments=2, quorum=1, in_flight=1, lease_timeout_s=600.0
    )
    c = cl.create(config, SOLO, learner_options=FAST_L, closer_options=FAST_C)
    c = deliver_until(cl.start(c, "n0"), writes(keys.ROUNDS_PREFIX + "000000000001", C))
    failed_at: float | None = None
    for _ in range(400):
        while c.inflight:
            item = c.inflight[0]
            lease_list = (
                isinstance(item.command, List) and item.command.prefix == keys.LEASES_PREFIX
            )
            state = c.nodes["n0"].closer
            assert state is not None
            if failed_at is None and lease_list and state.discovery is Listing.OUT:
                failed_at = c.now_s
                c = cl.deliver(c, 0, cl.Fault.FAIL)
            else:
                c = cl.deliver(c, 0)
        if failed_at is not None and len(cl.records(c)) > 2:
            break
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        c = cl.train(c, "n0", 1)
        c = cl.tick(c, 0.05)
    assert failed_at is not None, "no lease listing was awaited by a round"
    assert len(cl.records(c)) > 2, "the round waited past the failed listing"
    assert c.now_s - failed_at < 2 * FAST_C.poll_s + 1.0
    assert not cl.check(c)
