"""Bounded progress: from a state, a fair run without faults commits a round in time.

Theory of operation
-------------------
Safety is checked in every state; liveness needs a schedule. From a state the
checker reached, :func:`fair_commits` runs the fairest continuation there is —
every command in flight lands in order, every due timer fires, every learner
trains to the step its core waits for, and the clock jumps to the next timer —
with no failures, crashes or restarts, for ``within_s`` virtual seconds, and
reports whether the tape grew. The property is only claimed when it should hold:
a quorum of live learner machines and at least one live closer machine
(:func:`expects_progress`). A fair run that keeps issuing commands without the
clock moving is a livelock and fails the property too.
"""

from __future__ import annotations

from gm_core import cluster, learner
from gm_core.check.actions import next_deadline

MAX_INSTANT_ACTIONS = 5_000
"""Deliveries at one instant beyond which the fair run is declared a livelock."""


def expects_progress(c: cluster.Cluster) -> bool:
    learners = sum(
        1
        for n in c.nodes.values()
        if n.alive and n.learner is not None and n.learner.phase is not learner.Phase.CLOSED
    )
    closers = sum(1 for n in c.nodes.values() if n.alive and n.closer is not None)
    return closers > 0 and learners >= c.manifest.config.quorum


def fair_commits(c: cluster.Cluster, within_s: float) -> tuple[bool, cluster.Cluster]:
    """Whether a fair run from ``c`` commits a new record within ``within_s``; its end state."""
    start = len(cluster.records(c))
    deadline = c.now_s + within_s
    while True:
        c, quiet = _settle(c)
        for name in sorted(c.nodes):
            node = c.nodes[name]
            if quiet and cluster.can_train(c, name) and node.pace is not None:
                c = cluster.train(c, name, node.pace.next_step - node.step)
        if quiet:
            c, quiet = _settle(c)
        if not quiet:
            return False, c
        if len(cluster.records(c)) > start:
            return True, c
        upcoming = next_deadline(c)
        if upcoming is None or upcoming > deadline:
            return False, c
        c = cluster.tick(c, upcoming - c.now_s)


def _settle(c: cluster.Cluster) -> tuple[cluster.Cluster, bool]:
    """Deliver everything in flight and fire every due timer until nothing is left to do.

    False when that never ends at this instant (a livelock).
    """
    for _ in range(MAX_INSTANT_ACTIONS):
        if c.inflight:
            c = cluster.deliver(c, 0)
            continue
        due = cluster.due_timers(c)
        if not due:
            return c, True
        c = cluster.fire(c, *due[0])
    return c, False
