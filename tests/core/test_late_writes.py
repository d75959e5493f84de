"""A key re-created after its round's record: a late write, not a second creation.

``one_record_per_round`` counts creations over the ghost history. A learner that
restarts after its earlier incarnation published round ``r`` may publish ``r`` again;
if ``r`` was committed and swept in between, that PutOnce re-creates a swept key
(swarm seed 101760). The round's decision is already made, so the object can take no
part in it (late collection deletes it): the invariant leaves such late writes out,
and still reports any key created twice before its round was decided.
"""

from __future__ import annotations

import attrs
from fast_cluster import FAST_C, FAST_L, C, L
from test_cluster_stateful import run_fair

from gm_core import cluster as cl
from gm_core import invariants, keys
from gm_core.commands import PutOnce
from gm_core.records import AlgorithmConfig

CONFIG = AlgorithmConfig(sync_every=4, fragments=1, quorum=1)


def _committed_view() -> invariants.ClusterView:
    c = cl.create(CONFIG, {"n0": frozenset({L, C})}, learner_options=FAST_L, closer_options=FAST_C)
    c = run_fair(cl.start(c, "n0"), 40)
    assert len(invariants.read_tape(cl.view(c))) >= 2
    return cl.view(c)


def _recreate(view: invariants.ClusterView, at: int) -> invariants.ClusterView:
    """The history with round 0's snapshot created again at position ``at``."""
    created = list(view.store.created)
    key, data = next((k, d) for k, d in created if k == keys.snapshot(0, "n0"))
    created.insert(at, (key, data))
    return attrs.evolve(view, store=attrs.evolve(view.store, created=tuple(created)))


def _position_of_record(view: invariants.ClusterView, round_: int) -> int:
    return next(i for i, (k, _) in enumerate(view.store.created) if k == keys.round_record(round_))


def test_a_snapshot_recreated_after_its_round_was_decided_is_late_not_a_violation() -> None:
    view = _committed_view()
    late = _recreate(view, len(view.store.created))
    assert invariants.one_record_per_round(late) == ()
    assert len(invariants.timely(late.store)) == len(view.store.created)


def test_a_snapshot_created_twice_before_its_round_was_decided_is_a_violation() -> None:
    view = _committed_view()
    early = _recreate(view, _position_of_record(view, 0))
    assert invariants.one_record_per_round(early) == (f"{keys.snapshot(0, 'n0')} created 2 times",)


def _write_record_pointing_nowhere(key: str) -> cl.Cluster:
    """A committed cluster with round 1's payloads swept, after a closer's create-once write
    at ``key`` of round 1's record, which points at them."""
    c = cl.create(CONFIG, {"n0": frozenset({L, C})}, learner_options=FAST_L, closer_options=FAST_C)
    c = run_fair(cl.start(c, "n0"), 40)
    record = c.store.get(keys.round_record(1))
    assert record is not None
    swept = c.store.delete_prefix(keys.payload_prefix(1))
    write = PutOnce(req=10_000, key=key, data=record.data)
    node = c.nodes["n0"]
    pending = cl.InFlight(node="n0", machine=C, incarnation=node.incarnation, command=write)
    c = attrs.evolve(c, store=swept, inflight=(pending, *c.inflight), violations=())
    return cl.deliver(c, 0)


def test_a_record_write_that_finds_its_key_taken_is_not_judged_for_its_pointers() -> None:
    """Swarm seed 109223: a closer that fell behind tried to commit a round another closer
    had committed and swept; its write created nothing, so nobody can follow its pointers."""
    c = _write_record_pointing_nowhere(keys.round_record(1))
    assert [v for v in c.violations if v.invariant == "payload_before_pointer"] == []


def test_a_record_created_before_its_payloads_exist_is_a_violation() -> None:
    c = _write_record_pointing_nowhere(keys.round_record(999))  # far past the tape's end
    assert c.store.get(keys.round_record(999)) is not None
    found = [v for v in c.violations if v.invariant == "payload_before_pointer"]
    assert found
    assert all("points at missing payloads/" in v.message for v in found)
