"""The named invariants, checked cheaply after every action of a simulation or a search.

Theory of operation
-------------------
:func:`gm_core.cluster.check` reruns every invariant from scratch; the simulator
and the model checker call it after every action, millions of times, and most
actions change nothing an invariant over the store can see. So the invariants
are split: :data:`STORE_ONLY` names those whose answer is a function of the store
(and the run's manifest) alone — the caller reruns them only when the store
changed (the simulator) or looks their answer up by the store's fingerprint (the
checker). Every other invariant, and every violation the cluster recorded at a
moment (payload before pointer, learner monotonicity), is judged every time.

Of the others, :data:`PER_NODE` names those that are a conjunction over the nodes
of a check of one node against the store (a learner behind the tape, a record a
node holds that the run did not write): the checker judges them one node at a time
(:func:`one_node`) and remembers each node's answer per (store, node state), which
recurs far more often than the states of all nodes at once.

The split is by name, and a test pins it to :data:`invariants.STATE_INVARIANTS`:
an invariant added later is in neither set, so it runs every time, over every
node at once, until someone decides otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from gm_core import cluster, invariants

STORE_ONLY = frozenset(
    {
        "one_record_per_round",
        "contiguous_tape",
        "record_consistency",
        "schedule_coverage",
        "retention",
        "one_snapshot_per_learner_per_round",
        "acceptance_soundness",
        "single_committer",
        "grace_bounds",
        "chained_tape",
    }
)
"""State invariants that read only ``view.store`` and ``view.manifest``."""

PER_NODE = frozenset({"learners_behind_commits", "forgeries_ignored"})
"""State invariants that hold of a view exactly when they hold of each node's
:func:`one_node` view (each message is about one node, or about the store alone)."""


def judge(view: invariants.ClusterView, names: Iterable[str]) -> list[invariants.Violation]:
    """The violations of the named state invariants, in the module's order."""
    wanted = frozenset(names)
    return [
        invariants.Violation(invariant=name, message=message)
        for name, fn in invariants.STATE_INVARIANTS.items()
        if name in wanted
        for message in fn(view)
    ]


def store_part() -> tuple[str, ...]:
    return tuple(n for n in invariants.STATE_INVARIANTS if n in STORE_ONLY)


def node_part() -> tuple[str, ...]:
    return tuple(n for n in invariants.STATE_INVARIANTS if n not in STORE_ONLY)


def per_node_part() -> tuple[str, ...]:
    return tuple(n for n in invariants.STATE_INVARIANTS if n in PER_NODE)


def whole_part() -> tuple[str, ...]:
    """The invariants judged over every node at once: neither store-only nor per node."""
    return tuple(n for n in invariants.STATE_INVARIANTS if n not in STORE_ONLY | PER_NODE)


def one_node(view: invariants.ClusterView, name: str) -> invariants.ClusterView:
    """``view`` with only ``name``'s machines (members, store and manifest kept)."""
    if set(view.learners) <= {name} and set(view.closers) <= {name}:
        return view  # it has no other node's machines (one node, or the others down)
    learners = {name: view.learners[name]} if name in view.learners else {}
    closers = {name: view.closers[name]} if name in view.closers else {}
    return attrs.evolve(view, learners=learners, closers=closers)


def recorded(c: cluster.Cluster) -> list[invariants.Violation]:
    """Moment invariants the cluster judged while it ran (payload before pointer, ...)."""
    return list(c.violations)
