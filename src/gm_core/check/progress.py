"""Progress: from a state, a fair run without faults commits a round in time.

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

The liveness check (:class:`FairRuns`) asks more, of *every* reachable state:
the fair continuation from it commits the next round within ``within_s``, with
no quorum condition — after healing just enough (:func:`healed`): crashed nodes
stay down while a closer machine and a learner machine are still up, else every
crashed node restarts. That is the protocol's promise (§10.1: a round closes on
a quorum *or* once every live learner has reported; a dead learner's lease goes
stale), which bounded progress, claimed only with a quorum alive and judged only
where exploration stops, cannot see broken. Fair runs from different states
merge quickly (they deliver everything and meet at the next timer), so
:class:`FairRuns` remembers, per fingerprint of each state a run passes at a
timer instant, when its next commit came; a later run stops at the first state
it has seen before.
"""

from __future__ import annotations

from collections.abc import Callable

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
        c, quiet = _instant(c)
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


def healed(c: cluster.Cluster) -> cluster.Cluster:
    """``c`` with its crashed nodes restarted, unless a closer and a learner are still up."""
    up = [n for n in c.nodes.values() if n.alive]
    if any(n.closer is not None for n in up) and any(n.learner is not None for n in up):
        return c
    for name in sorted(c.nodes):
        if not c.nodes[name].alive:
            c = cluster.start(c, name)
    return c


class FairRuns:
    """When the fair continuation from a state first commits a new record.

    ``horizon_s`` is an absolute virtual time: a run that has not committed when
    its next timer lies beyond it (or that livelocks, or has no timer left) is
    recorded as never committing. Answers are remembered by the fingerprint of
    each state a run passes at the start of an instant, so they are shared by
    every run that meets it.
    """

    def __init__(self, fingerprint: Callable[[cluster.Cluster], bytes], horizon_s: float) -> None:
        self._fingerprint = fingerprint
        self._horizon_s = horizon_s
        self._next_commit: dict[bytes, float | None] = {}
        self.runs = 0

    def next_commit_s(self, c: cluster.Cluster) -> float | None:
        """The virtual time at which the fair run from ``c`` (healed) commits a new record."""
        self.runs += 1
        c = healed(c)
        path: list[tuple[bytes, int]] = []  # (fingerprint, records) of each instant's start
        commits: list[float | None] = []  # per path entry: its commit time, once known
        while True:
            key = self._fingerprint(c)
            records = len(cluster.records(c))
            if key in self._next_commit:
                self._resolve(path, commits, records, self._next_commit[key])
                return commits[0] if commits else self._next_commit[key]
            path.append((key, records))
            commits.append(None)
            c, quiet = _instant(c)
            after = len(cluster.records(c))
            for i, (_, before) in enumerate(path):
                if commits[i] is None and after > before:
                    commits[i] = c.now_s
            if after > records:  # every state on the path has seen its next commit
                self._resolve(path, commits, after, None)
                return commits[0]
            upcoming = next_deadline(c)
            if not quiet or upcoming is None or upcoming > self._horizon_s:
                self._resolve(path, commits, after, None)
                return commits[0]
            c = cluster.tick(c, upcoming - c.now_s)

    def _resolve(
        self,
        path: list[tuple[bytes, int]],
        commits: list[float | None],
        records: int,
        then: float | None,
    ) -> None:
        """Settle every open entry of ``path``: those at ``records`` commit when ``then`` says."""
        for i, (key, before) in enumerate(path):
            if commits[i] is None and before == records:
                commits[i] = then
            self._next_commit[key] = commits[i]


def _instant(c: cluster.Cluster) -> tuple[cluster.Cluster, bool]:
    """One instant of the fair run: settle, let every learner train, settle again."""
    c, quiet = _settle(c)
    if not quiet:
        return c, False
    for name in sorted(c.nodes):
        node = c.nodes[name]
        if cluster.can_train(c, name) and node.pace is not None:
            c = cluster.train(c, name, node.pace.next_step - node.step)
    return _settle(c)
