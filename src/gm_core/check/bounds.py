"""The bound sets the project checks: in ``make test`` (CI), and in ``make check-long``.

Theory of operation
-------------------
Each bound set is a small cluster and how far to explore it, named for the
behaviour it is there to cover. :data:`CI_BOUNDS` is what ``gm check --ci`` and
``tests/check`` explore on every ``make test`` (their state counts are pinned
there, as a change detector) — among them the single-closer set in which a
learner gives a round up (spec §15.2), which failed with "not live" until the
learner retried and paused its lease; :data:`LONG_BOUNDS` and :data:`DEEP_BOUNDS`
are the larger sets of ``make check-long``. The sets that name their delays are
delay-bounded (:attr:`~gm_core.check.explore.Bounds.delays`): they reach four
rounds, or two with the either-role closer crashing, which no exhaustive search
reaches in CI time, at the price of exploring only the runs that stray from the
fair schedule once or twice. :data:`COORDINATION_BOUNDS` are the shared queue's,
the ranks' and the barrier's sets (spec/coordination.md), explored by their own
searches (:mod:`gm_core.check.queue`, :mod:`gm_core.check.barrier`) in the same
``gm check --ci``, each with a crash and same-id restart or lost responses. The
planted bugs (:mod:`gm_core.check.plants`) are judged in these same sets where
they can be.
"""

from __future__ import annotations

from gm_core.check.barrier import BarrierBounds
from gm_core.check.explore import Bounds
from gm_core.check.forger import Forgery
from gm_core.check.queue import QueueBounds

CI_BOUNDS: dict[str, Bounds] = {
    "one node, one fault": Bounds(roles=("lc",), rounds=1, max_time_s=1.0, faults=1),
    "one node, one crash": Bounds(
        roles=("lc",), rounds=1, max_time_s=1.0, crashes=1, liveness=True
    ),
    "learner and closer apart": Bounds(roles=("l", "c"), rounds=1, max_time_s=1.0),
    "two learners, one closes": Bounds(roles=("lc", "l"), rounds=1, max_time_s=0.5),
    "two closers race for round 0": Bounds(roles=("lc", "c"), rounds=1, max_time_s=0.5),
    "two closers race, one fault": Bounds(roles=("lc", "c"), rounds=1, max_time_s=0.5, faults=1),
    "three closers contend for round 0": Bounds(roles=("lc", "c", "c"), rounds=1, max_time_s=0.5),
    "three nodes, two fragments": Bounds(
        roles=("lc", "l", "l"), fragments=2, rounds=1, max_time_s=0.5
    ),
    "the closer crashes and restarts across two rounds": Bounds(
        roles=("l", "c"), rounds=2, max_time_s=1.0, crashes=1, crashable=("n1",), liveness=True
    ),
    "a learner dies for good, quorum 2": Bounds(
        roles=("lc", "l"),
        quorum=2,
        rounds=1,
        max_time_s=0.5,
        crashes=1,
        crashable=("n1",),
        liveness=True,
    ),
    "one node two rounds in flight": Bounds(roles=("lc",), in_flight=2, rounds=2, max_time_s=1.0),
    "one closer, a learner gives a round up": Bounds(
        roles=("lc", "l"),
        quorum=2,
        rounds=1,
        max_time_s=0.5,
        faults=1,
        capture_faults=True,
        store_faults=False,
        liveness=True,
    ),
    "a forger without the key writes a snapshot": Bounds(
        roles=("lc", "l"), rounds=1, max_time_s=0.5, run_key=True, forge=(Forgery.SNAPSHOT,)
    ),
    # Progress too: a forged record at slot 0 is skipped, the record goes to slot 1 (§16.4).
    "a forger without the key, two rounds": Bounds(
        roles=("lc",),
        rounds=2,
        max_time_s=0.5,
        run_key=True,
        forge=(Forgery.SNAPSHOT, Forgery.RECORD),
    ),
    # Per-node keys (§16.3): a member (run key and its own key, learner role) writes a
    # plausible, chained commit; only its signer's role refuses it.
    "a member forges a commit (per-node keys)": Bounds(
        roles=("lc",),
        rounds=2,
        max_time_s=0.5,
        run_key=True,
        member=True,
        forge=(Forgery.RECORD,),
    ),
    # ...and a snapshot in n1's name at n1's key: n1 writes its next slot, the closer
    # skips the forgery (not_allowed) and merges n1's own.
    "a member forges a snapshot as another (per-node keys)": Bounds(
        roles=("lc", "l"),
        rounds=1,
        max_time_s=0.5,
        run_key=True,
        member=True,
        forge=(Forgery.SNAPSHOT,),
    ),
    # ...and the claim a follower bids first (attempt 1, its keyed name), while the named
    # closer may crash: the follower refuses it (not_allowed: only closers claim) and bids 2.
    "a member forges a claim (per-node keys)": Bounds(
        roles=("lc", "c"),
        rounds=1,
        max_time_s=0.5,
        crashes=1,
        crashable=("n0",),
        run_key=True,
        member=True,
        forge=(Forgery.CLAIM,),
    ),
    # ...and, revoked from round 0 (every node knows it), its own snapshot in its own name:
    # only the revocation refuses it (revoked), n1 is merged.
    "a revoked member publishes its own snapshot (per-node keys)": Bounds(
        roles=("lc", "l"),
        rounds=1,
        max_time_s=0.5,
        run_key=True,
        member=True,
        revoked=True,
        forge=(Forgery.SNAPSHOT,),
    ),
    # Delay-bounded (Bounds.delays): deeper than an exhaustive search gets in CI time, every
    # run that leaves the fair schedule at most once or twice (a crash, a restart before the
    # others go idle, a reordered delivery, a fired timer ahead of a delivery each count one).
    "an either-role closer crashes across two rounds (2 delays)": Bounds(
        roles=("lc", "l"),
        rounds=2,
        max_time_s=4.0,
        crashes=1,
        crashable=("n0",),
        liveness=True,
        delays=2,
    ),
    "three nodes, two fragments, four rounds, the closer crashes (1 delay)": Bounds(
        roles=("lc", "l", "l"),
        fragments=2,
        rounds=4,
        max_time_s=8.0,
        crashes=1,
        crashable=("n0",),
        liveness=True,
        delays=1,
    ),
}
"""The bounds ``make test`` checks and pins the state counts of."""

LONG_BOUNDS: dict[str, Bounds] = {
    "two closers race through a poll": Bounds(roles=("lc", "c"), rounds=1, max_time_s=1.0),
    "two learners, one closes, through a poll": Bounds(roles=("lc", "l"), rounds=1, max_time_s=1.0),
    "one node, two rounds": Bounds(roles=("lc",), rounds=2, max_time_s=2.0),
}
"""Larger bounds for ``make check-long`` and ``gm check --long`` (pinned by slow tests)."""

DEEP_BOUNDS: dict[str, Bounds] = {
    "three nodes, two fragments, four rounds, the closer crashes (2 delays)": Bounds(
        roles=("lc", "l", "l"),
        fragments=2,
        rounds=4,
        max_time_s=8.0,
        crashes=1,
        crashable=("n0",),
        liveness=True,
        delays=2,
    ),
}
"""The deepest set ``make check-long`` explores (pinned by a slow test): four rounds of three
nodes and two fragments with the closer crashing, delay-bounded. Exhaustively it is out of
reach (over a million states before the first record, spec/protocol.md §15.9)."""

COORDINATION_BOUNDS: dict[str, QueueBounds | BarrierBounds] = {
    "queue: one node, two units, a crash and restart": QueueBounds(nodes=1, units=2, crashes=1),
    "queue: one node, two units, prefetch 1, a crash": QueueBounds(
        nodes=1, units=2, prefetch=1, crashes=1
    ),
    "queue: one node, two units, two lost responses": QueueBounds(nodes=1, units=2, losses=2),
    "queue: two nodes race for one unit": QueueBounds(nodes=2, units=1),
    "ranks: one node, two ranks, a crash, a watch": QueueBounds(
        nodes=1, units=2, ranks=True, crashes=1, watches=1
    ),
    # finished_sound: the node leaves after its rank and looks; rank 1 holds the run open.
    "ranks: one node, two ranks, it looks when its rank is done": QueueBounds(
        nodes=1, units=2, ranks=True, crashes=1, looks=1
    ),
    "queue: one node, two units, it looks when they are done": QueueBounds(
        nodes=1, units=2, crashes=1, looks=1
    ),
    # either_gives_back: elected between units, it gives its prefetched unit back.
    "queue: an either node elected after a unit, prefetch 1": QueueBounds(
        nodes=1, units=2, prefetch=1, crashes=1, elections=1
    ),
    # finished_sound's lease half: n1 is live (its lease new on n0's clock) when n0 runs out.
    "queue: two nodes, one unit, the first to run out looks": QueueBounds(
        nodes=2, units=1, looks=1, max_time_s=0.5
    ),
    # Session.run's consumer: claims ahead while a unit trains, the next one started at once.
    "queue: one node, three units, pipelined, a crash": QueueBounds(
        nodes=1, units=3, prefetch=1, crashes=1, pipelined=True
    ),
    "queue: one node, two units, pipelined, two lost responses": QueueBounds(
        nodes=1, units=2, prefetch=1, losses=2, pipelined=True
    ),
    "barrier: two parties": BarrierBounds(parties=2, waiters=2, timeout_s=1.5),
    "barrier: one party, two waiters overflow": BarrierBounds(parties=1, waiters=2, timeout_s=1.5),
    "barrier: two parties, a lost response": BarrierBounds(
        parties=2, waiters=2, timeout_s=1.5, losses=1
    ),
    "barrier: two parties, a crash and restart": BarrierBounds(
        parties=2, waiters=2, timeout_s=1.5, crashes=1
    ),
}
"""The coordination sets ``gm check --ci`` explores after :data:`CI_BOUNDS` (pinned in
tests/check/test_queue_check.py and test_barrier_check.py). Two nodes contending for ranks
are in :data:`COORDINATION_LONG_BOUNDS`: with a crash and restart 191,399 states (75 CPU-s),
with a watch 73,663 (29 CPU-s); two ranks are over 300,000 (the queue's search has no
partial-order reduction; spec/invariants.md "Shared queue and ranks")."""

COORDINATION_LONG_BOUNDS: dict[str, QueueBounds | BarrierBounds] = {
    # At most one live holder per rank, with two nodes after it (one node cannot break it).
    "ranks: two nodes contend for one rank, a watch": QueueBounds(
        nodes=2, units=1, ranks=True, watches=1
    ),
    "ranks: two nodes contend for one rank, a crash and restart": QueueBounds(
        nodes=2, units=1, ranks=True, crashes=1
    ),
}
"""The coordination sets ``make check-long`` adds (``gm check --long``; pinned by slow tests
in tests/check/test_queue_check.py)."""
