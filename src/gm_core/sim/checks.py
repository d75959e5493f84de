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

The split is by name, and a test pins it to :data:`invariants.STATE_INVARIANTS`:
an invariant added later is not in :data:`STORE_ONLY`, so it runs every time until
someone decides otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    }
)
"""State invariants that read only ``view.store`` and ``view.manifest``."""


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


def recorded(c: cluster.Cluster) -> list[invariants.Violation]:
    """Moment invariants the cluster judged while it ran (payload before pointer, ...)."""
    return list(c.violations)
