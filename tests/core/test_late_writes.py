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
