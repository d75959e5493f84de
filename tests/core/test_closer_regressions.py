"""Regressions found by the real runtime (tests/runtime), replayed on the pure cluster.

1. Snapshots arrive in any key order. A closer that listed ``snapshots/r/`` once
   and later listed only *after the greatest key seen* never saw a learner whose
   id sorts lower but whose snapshot landed later: with a quorum of two, the
   round could never close.
2. A leader deposed while it collected (a follower judged it dead and took the
   round over through a claim) must learn of the winner's record; otherwise it
   collects a finished round forever and never leads or follows again.
3. A snapshot folder flooded with keys that sort ahead of the learners' ids: the
   shell reads a capped number of keys per listing (gm_shell.limits), so the
   learners' own snapshots were never listed and, with a quorum of all, no round
   closed again. The leader now reads known learners' snapshots by name when a
   listing is cut (spec/protocol.md §16.4.5).
"""

from __future__ import annotations

import random

from fast_cluster import FAST_C, FAST_L, C, L, drive

from gm_core import cluster as cl
from gm_core import keys
from gm_core.records import AlgorithmConfig


def test_snapshots_landing_in_any_key_order_are_all_collected() -> None:
    roles = {"a": frozenset({L, C}), "b": frozenset({L}), "c": frozenset({L})}
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    c = drive(c, 300, random.Random(7))
    counts = [len(r.participants) for r in cl.records(c)]
    assert len(counts) >= 12, counts
    # The first round may close before the closer has seen every learner's lease.
    assert all(n == 3 for n in counts[1:]), counts


def test_a_deposed_leader_adopts_the_record_of_the_round_it_was_collecting() -> None:
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
    config = AlgorithmConfig(
        sync_every=8, fragments=2, quorum=3, in_flight=1, lease_timeout_s=4.0, takeover_floor_s=6.0
    )
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    rng = random.Random(3)
    c = drive(c, 40, rng)
    leader = cl.records(c)[-1].next_closer
    c = drive(c, 80, rng, hung=frozenset({leader}))  # silent long enough to be taken over
    taken = max(r.round for r in cl.records(c))
    c = drive(c, 80, rng)
    state = c.nodes[leader].closer
    assert state is not None
    assert state.round > taken, f"{leader} still at round {state.round} ({state.phase})"


def test_a_flooded_snapshot_folder_hides_no_known_learner() -> None:
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C, list_cap=8)
    for name in sorted(roles):
        c = cl.start(c, name)
    rng = random.Random(5)
    while not cl.records(c):
        c = drive(c, 1, rng)
    flooded = range(cl.records(c)[-1].round + 1, cl.records(c)[-1].round + 9)
    for r in flooded:  # "a…" sorts ahead of every learner's id
        for i in range(12):
            c = cl.inject(c, keys.snapshot(r, f"a{i:02d}"), b"{}")
    c = drive(c, 300, rng)
    records = {r.round: r for r in cl.records(c)}
    assert flooded[-1] in records, f"stuck at round {max(records)}"
    for r in flooded:
        assert len(records[r].participants) == 3, records[r]
