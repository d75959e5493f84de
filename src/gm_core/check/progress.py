"""Progress: from a state, a fair run without faults commits a round in time.

Theory of operation
-------------------
Safety is checked in every state; liveness needs a schedule. From a state the
checker reached, the fairest continuation there is (:func:`fair_step`, one step
at a time) lets the oldest command in flight land, else fires the first due
timer, else lets the first learner that is behind its pace train to it, else
moves the clock to the next timer and fires every timer due then — with no
failures, crashes or restarts. Each step is a step of the search itself (the
same actions, carried out as the search carries them out), so the states
a fair run passes are states the search reaches too. :func:`fair_commits` runs
it for ``within_s`` virtual seconds and reports whether the tape grew. Bounded
progress claims it only when it should hold: a quorum of live learner machines
and at least one live closer machine (:func:`expects_progress`). A fair run that
keeps taking steps without the clock moving is a livelock and fails too.

The liveness check (:class:`FairRuns`) asks more, of *every* reachable state:
the fair continuation from it commits the next round within ``within_s``, with
no quorum condition — after healing just enough (:func:`healed`): crashed nodes
stay down while a closer machine and a learner machine are still up, else every
crashed node restarts. That is the protocol's promise (§10.1: a round closes on
a quorum *or* once every live learner has reported; a dead learner's lease goes
stale), which bounded progress, claimed only with a quorum alive and judged only
where exploration stops, cannot see broken.

Fair runs are deterministic and pass through states the search reaches later,
so :class:`FairRuns` remembers, per fingerprint of every state a run passes where
the clock moved (and of the state it started from), when the next commit after
it came; a run stops at the first state whose answer is known, and the search's
own question about that state is then a lookup. Two
states with one fingerprint may hold their commands in flight in different
orders, so their fair runs may differ; the answer kept is that of one fair
continuation, which is what the property asks for (a correct protocol commits
under every one).
"""

from __future__ import annotations

from collections.abc import Callable

from gm_core import cluster, learner
from gm_core.check.actions import Action, Kind, apply, next_deadline

MAX_INSTANT_ACTIONS = 5_000
"""Steps at one instant beyond which the fair run is declared a livelock."""

Take = Callable[[cluster.Cluster, Action], cluster.Cluster]
"""How the search carries out an action (its payload work settled at once, or not)."""


def expects_progress(c: cluster.Cluster) -> bool:
    learners = sum(
        1
        for n in c.nodes.values()
        if n.alive and n.learner is not None and n.learner.phase is not learner.Phase.CLOSED
    )
    closers = sum(1 for n in c.nodes.values() if n.alive and n.closer is not None)
    return closers > 0 and learners >= c.manifest.config.quorum


def fair_action(c: cluster.Cluster, until_s: float) -> Action | None:
    """The fair run's next action; None when nothing is left to do before ``until_s``.

    A learner trains only while it is behind its pace (a trainable learner's pace
    always lies ahead of the step it reported), so training cannot repeat at one
    instant without the learner asking for it.
    """
    if c.inflight:
        first = c.inflight[0]
        return Action(
            kind=Kind.DELIVER,
            node=first.node,
            machine=first.machine,
            incarnation=first.incarnation,
            req=int(getattr(first.command, "req", -1)),
        )
    due = cluster.due_timers(c)
    if due:
        return Action(kind=Kind.FIRE, node=due[0][0], machine=due[0][1])
    for name in sorted(c.nodes):
        node = c.nodes[name]
        pace = node.pace
        if cluster.can_train(c, name) and pace is not None and node.step < pace.next_step:
            return Action(kind=Kind.TRAIN, node=name)
    upcoming = next_deadline(c)
    if upcoming is None or upcoming > until_s:
        return None
    return Action(kind=Kind.TICK)


def fair_step(c: cluster.Cluster, until_s: float, take: Take = apply) -> cluster.Cluster | None:
    """The state after the fair run's next action, or None (:func:`fair_action`)."""
    action = fair_action(c, until_s)
    return None if action is None else take(c, action)


class _Tape:
    """The tape's length along a run, re-read only when the store changed."""

    def __init__(self, c: cluster.Cluster) -> None:
        self._store = c.store
        self.start = self.length = len(cluster.records(c))

    def grew(self, c: cluster.Cluster) -> bool:
        if c.store is not self._store:
            self._store = c.store
            self.length = len(cluster.records(c))
        return self.length > self.start


def fair_commits(
    c: cluster.Cluster, within_s: float, take: Take = apply
) -> tuple[bool, cluster.Cluster]:
    """Whether a fair run from ``c`` commits a new record within ``within_s``; its end state."""
    deadline = c.now_s + within_s
    tape = _Tape(c)
    steps = 0
    while True:
        after = fair_step(c, deadline, take)
        if after is None:
            return False, c
        steps = steps + 1 if after.now_s == c.now_s else 0
        c = after
        if tape.grew(c):
            return True, finish_instant(c, take)
        if steps > MAX_INSTANT_ACTIONS:
            return False, c


def finish_instant(c: cluster.Cluster, take: Take = apply) -> cluster.Cluster:
    """``c`` after the fair run has done everything due at its instant.

    A run is judged at whole instants: what a commit sets off at once (the next
    round's first reads, the learners' next steps) must not raise either. It stops at
    the next commit at the same instant: a node whose learner and closer tell each other
    of their writes (spec/protocol.md §6.4) needs no poll, and its rounds, trained in no
    time by the model, would follow one another without the clock moving until
    ``MAX_INSTANT_ACTIONS`` cut them.
    """
    tape = _Tape(c)
    for _ in range(MAX_INSTANT_ACTIONS):
        after = fair_step(c, c.now_s, take)
        if after is None:
            return c
        c = after
        if tape.grew(c):
            return c
    return c


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
    its next timer lies beyond it (or that livelocks at one instant) is recorded as
    never committing. Answers are remembered by the fingerprint of every state a run
    passes where the clock moved, so they are shared by every run that meets it.
    """

    def __init__(
        self,
        fingerprint: Callable[[cluster.Cluster], bytes],
        horizon_s: float,
        take: Take = apply,
    ) -> None:
        self._fingerprint = fingerprint
        self._horizon_s = horizon_s
        self._take = take
        self._next_commit: dict[bytes, float | None] = {}
        self.runs = 0
        """Questions asked of a state whose answer was not known yet."""

    def next_commit_s(self, c: cluster.Cluster, key: bytes | None = None) -> float | None:
        """The virtual time at which the fair run from ``c`` (healed) commits a new record.

        ``key`` is ``c``'s fingerprint when the caller has it.
        """
        first = self._fingerprint(c) if key is None else key
        if first in self._next_commit:
            return self._next_commit[first]
        self.runs += 1
        path = [first]
        then = self._walk(healed(c), path)
        for passed in path:
            self._next_commit[passed] = then
        return then

    def _walk(self, c: cluster.Cluster, path: list[bytes]) -> float | None:
        """Run on from ``c`` until a commit or a known answer; ``path`` gets each state passed
        where the clock moved.

        Only those states are fingerprinted: runs meet again by the next instant at the
        latest, and a fingerprint costs as much as a step (measured: 31,540 steps of 3,728
        instants on the closer-crash bound set). A run that goes round at one instant
        is cut by ``MAX_INSTANT_ACTIONS``, as :func:`fair_commits` cuts it; across
        instants it cannot come back, since the clock is part of the fingerprint.
        """
        tape = _Tape(c)
        steps = 0
        while True:
            after = fair_step(c, self._horizon_s, self._take)
            if after is None:
                return None
            moved = after.now_s != c.now_s
            steps = 0 if moved else steps + 1
            c = after
            if tape.grew(c):
                finish_instant(c, self._take)
                return c.now_s
            if steps > MAX_INSTANT_ACTIONS:  # round and round at one instant
                return None
            if not moved:
                continue
            key = self._fingerprint(c)  # the clock is in it: a run never comes back
            if key in self._next_commit:
                return self._next_commit[key]
            path.append(key)
