"""Exhaustive breadth-first exploration of a small cluster, checking every invariant.

Theory of operation
-------------------
The state space is that of :mod:`gm_core.cluster` — the real learner and closer
machines and the model store — under every action of
:mod:`gm_core.check.actions`: any command in flight may land next (so every
interleaving of store operations is tried), fail, or land with its response
lost; any due timer may fire; any learner may train; any node may crash and
restart; the clock may jump to the next timer. :class:`Bounds` keeps it finite:
exploration stops at a state once ``rounds`` records exist, the clock never
passes ``max_time_s``, and at most ``faults`` request faults and ``crashes``
crashes happen on any path.

Search is breadth-first, so the first violation found has a shortest trace. It
carries sleep sets (:mod:`gm_core.check.independence`): an action independent of
a sibling explored before it is not taken again after that sibling, since both
orders reach one state; a state's sleep set is the intersection over every
arrival in its layer. That prunes transitions, never states (the state counts
are those of the full search). A state is identified by its fingerprint plus
the fault budget it has spent; a state reached again with at least as much
budget left is not explored twice (more budget can only allow more behaviour,
so the pruning is sound). Every state is judged by every named invariant: those
over the store alone are looked up by the store's fingerprint, since many states
share one store, and those that hold node by node (``checks.PER_NODE``) by the
store's fingerprint and one node's state, since a state differs from its parent
in one node.

Bounded progress is judged from every state where exploration stopped before the
round bound — the clock bound reached and nothing left in flight — and from every
``progress_every``-th other state (by fingerprint, so the sample is
deterministic): while a quorum of learners and a closer live, a fair run without
faults must commit a new record within ``progress_within_s``.

Liveness (``Bounds.liveness``) asks that of every state, with no quorum condition
(:mod:`gm_core.check.progress`). The fair run's first step from a state is one of
the actions the search takes there (the oldest delivery, the first due timer, the
first learner behind its pace, the clock), so its answer is that of the state it
steps to; those links are kept per fingerprint and resolved once the search is
done, and the first state breadth first whose fair run does not commit in time
is the counterexample. Only where the fair run leaves the search (the round or
clock bound reached, a crashed node to restart first) is it run out there and
then (``FairRuns``, which remembers the answer of every state a run passes).
Bounded progress is then not judged apart: where it claims anything (a live
closer and a quorum of live learners) nothing is healed, so it asks the same
fair run the same question of fewer states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext

import attrs

from gm_core import closer, cluster, invariants, learner
from gm_core.check import forger, progress
from gm_core.check.actions import Action, Kind, apply, describe, enabled, settle_payloads
from gm_core.check.fingerprint import Fingerprinter
from gm_core.check.independence import Footprint, Recorder, independent
from gm_core.check.progress import FairRuns
from gm_core.check.search import collector_paused
from gm_core.check.steps import Steps
from gm_core.check.transitions import Transitions
from gm_core.records import ROLE_LEARNER, AlgorithmConfig, Alignment
from gm_core.sim import checks

ROLE_CODES = {"l": cluster.Machine.LEARNER, "c": cluster.Machine.CLOSER}


@attrs.frozen(kw_only=True)
class Bounds:
    """What to explore: the cluster, its config, and how far."""

    roles: tuple[str, ...] = ("lc", "lc", "l")
    sync_every: int = 2
    fragments: int = 1
    quorum: int = 1
    in_flight: int = 1
    alignment: Alignment = Alignment.OVERWRITE
    lease_timeout_s: float = 3.0
    takeover_floor_s: float = 4.0
    poll_s: float = 1.0
    renew_s: float = 2.0
    rounds: int = 2
    crashes: int = 0
    crashable: tuple[str, ...] = ()
    """The nodes that may crash (empty: every node)."""
    faults: int = 0
    store_faults_only: bool = True
    capture_faults: bool = False
    """A learner's Capture may fail too (it then gives the round up, §7.5)."""
    store_faults: bool = True
    """Store requests may fail (with ``store_faults_only``, turn off to fail captures alone)."""
    fifo: bool = True
    atomic_payloads: bool = True
    max_time_s: float = 4.0
    max_states: int = 2_000_000
    progress_every: int = 0
    progress_within_s: float = 30.0
    liveness: bool = False
    """Also judge, from every state, that the healed fair run commits in ``progress_within_s``."""
    run_key: bool = False
    """An authenticated run (gm_core.auth): every node holds :data:`forger.FORGER_KEY`."""
    forge: tuple[forger.Forgery, ...] = ()
    """What the forger may write, once each per path (gm_core.check.forger)."""
    member: bool = False
    """Per-node keys (with ``run_key``), and the forger is a member: a learner on the roster
    with the run key and its own key (gm_core.check.forger)."""
    revoked: bool = False
    """With ``member``: the forger is revoked from round 0, every node knowing it (as if
    learned from ``members/``, spec/protocol.md §16.3.3); its snapshot is then its own, in
    its own name (gm_core.check.forger), refused only as revoked."""
    progress: bool = True
    """Judge that the run can still commit where it stops (False: safety alone, for a
    forger whose record blocks its round until slots exist, spec/protocol.md §16.0)."""
    delays: int | None = None
    """Explore only the runs that leave the fair schedule at most this many times (a
    delay-bounded search; None: every run). A state's fair action is free, any other
    action — a reordered delivery, a fault, a crash, an early restart — costs one."""

    def config(self) -> AlgorithmConfig:
        return AlgorithmConfig(
            sync_every=self.sync_every,
            fragments=self.fragments,
            quorum=self.quorum,
            in_flight=self.in_flight,
            alignment=self.alignment,
            lease_timeout_s=self.lease_timeout_s,
            takeover_floor_s=self.takeover_floor_s,
        )

    def node_roles(self) -> dict[str, frozenset[cluster.Machine]]:
        return {
            f"n{i}": frozenset(ROLE_CODES[ch] for ch in code) for i, code in enumerate(self.roles)
        }


def initial_state(bounds: Bounds) -> cluster.Cluster:
    """The run created and every node started at time 0, in name order."""
    c = cluster.create(
        bounds.config(),
        bounds.node_roles(),
        learner_options=learner.LearnerOptions(
            poll_s=bounds.poll_s, renew_s=bounds.renew_s, close_timeout_s=4 * bounds.renew_s
        ),
        closer_options=closer.CloserOptions(poll_s=bounds.poll_s, renew_s=bounds.renew_s),
        run_key=forger.FORGER_KEY if bounds.run_key else None,
        members={forger.EVIL: (ROLE_LEARNER,)} if bounds.member else None,
        revoked={forger.EVIL: 0} if bounds.revoked else None,
    )
    for name in sorted(c.nodes):
        c = cluster.start(c, name)
    return settle(c, bounds)


@attrs.frozen(kw_only=True)
class Counterexample:
    """A shortest path to a bad state: the actions, readable lines, and what broke."""

    kind: str
    tokens: tuple[str, ...]
    lines: tuple[str, ...]
    violations: tuple[invariants.Violation, ...]

    def replay_arg(self) -> str:
        return ",".join(self.tokens)


@attrs.frozen(kw_only=True)
class Outcome:
    verdict: str  # "pass", "violation", "no progress", "not live", "exception" or "incomplete"
    states: int
    transitions: int
    depth: int
    progress_checks: int
    fair_runs: int
    max_records: int
    distinct: int = 0
    """Distinct states: ``states`` counts one again when it is reached with a budget (of
    faults, crashes or delays) that no earlier arrival's covers."""
    counterexample: Counterexample | None = None


@attrs.frozen(kw_only=True)
class ExploreProgress:
    depth: int
    states: int
    frontier: int


Key = tuple[bytes, int, int, int]
"""A state's fingerprint, and the faults, crashes and delays spent on the way to it."""
Sleep = dict[Action, Footprint]
"""A sleep set: actions a state need not take (their order is explored elsewhere), with
the footprint each had when it ran."""


def explore(
    bounds: Bounds,
    on_progress: Callable[[ExploreProgress], None] | None = None,
    *,
    sleep_sets: bool = True,
) -> Outcome:
    """Explore every state within ``bounds``; stop at the first (shortest) counterexample.

    ``sleep_sets=False`` takes every transition (the same states, more work).
    """
    if bounds.delays is not None:  # a sleeping action may be the only free one: no sleep sets
        sleep_sets = False
    recording = Recorder().installed() if sleep_sets else nullcontext(None)
    with collector_paused(), Transitions().installed() as transitions, recording as recorder:
        steps = Steps(lambda c, a: step(c, a, bounds), recorder, transitions.exact)
        return _Search(bounds, on_progress, steps).run()


class _Search:
    """One breadth-first search; its tables are mutable and live only inside :func:`explore`."""

    def __init__(
        self,
        bounds: Bounds,
        on_progress: Callable[[ExploreProgress], None] | None,
        steps: Steps,
    ):
        self.b = bounds
        self.on_progress = on_progress
        self.steps = steps
        self.sleep: dict[Key, Sleep] = {}
        """Per state of the layer being expanded: the actions it need not take."""
        self.next_sleep: dict[Key, Sleep] = {}
        """The same for the next layer, intersected over every arrival from this one."""
        self.parents: dict[Key, tuple[Key | None, Action | None]] = {}
        self.budgets: dict[bytes, list[tuple[int, ...]]] = {}
        self.store_verdicts: dict[bytes, list[invariants.Violation]] = {}
        self.node_verdicts: dict[tuple[object, ...], list[invariants.Violation]] = {}
        self.whole_verdicts: dict[tuple[object, ...], list[invariants.Violation]] = {}
        self.per_node = checks.per_node_part()
        self.whole = checks.whole_part()
        self.tape_lengths: dict[bytes, int] = {}
        self.fair_next: dict[bytes, tuple[bytes, bool, float]] = {}
        """Liveness, per state fingerprint: the state the fair run steps to first, whether
        that step committed, and when it happened."""
        self.commit_at: dict[bytes, float | None] = {}
        """Liveness, per state fingerprint: when the fair run from it commits (once known)."""
        self.now_at: dict[bytes, float] = {}
        self.transitions = 0
        self.progress_checks = 0
        self.max_records = 0
        self.depth = 0
        self.prints = Fingerprinter()
        self.fair = FairRuns(
            self.prints.state,
            bounds.max_time_s + bounds.progress_within_s,
            take=steps.state,
        )

    def run(self) -> Outcome:
        c0 = initial_state(self.b)
        k0: Key = (self.prints.state(c0), 0, 0, 0)
        self._admit(k0, None, None)
        if bad := self._judge(c0):
            return self._fail("violation", k0, bad)
        frontier = [(k0, c0)]
        while frontier:
            if self.on_progress is not None:
                self.on_progress(
                    ExploreProgress(
                        depth=self.depth, states=len(self.parents), frontier=len(frontier)
                    )
                )
            layer: list[tuple[Key, cluster.Cluster]] = []
            for key, c in frontier:
                found = self._expand(key, c, layer)
                if found is not None:
                    return found
                if len(self.parents) >= self.b.max_states:
                    return self._outcome("incomplete")
            frontier = layer
            self.sleep, self.next_sleep = self.next_sleep, {}
            self.depth += 1
        return self._not_live() or self._outcome("pass")

    def _expand(
        self, key: Key, c: cluster.Cluster, layer: list[tuple[Key, cluster.Cluster]]
    ) -> Outcome | None:
        records = self._records(c)
        self.max_records = max(self.max_records, records)
        free = self._free_action(c) if self.b.delays is not None else None
        actions = self._actions(key, c, free) if records < self.b.rounds else []
        stuck = not actions and records < self.b.rounds
        # With liveness, every state's fair run is judged anyway, with no quorum condition.
        judged = self.b.progress and not self.b.liveness and (stuck or self._sampled(key))
        if judged and not self._progresses(c):
            return self._fail("no progress", key, [])
        fair = self._fair_action(key[0], c, records) if self.b.liveness else None
        asleep = self.sleep.pop(key, {})
        done: list[tuple[Action, Footprint | None]] = []
        for action in actions:
            if action in asleep:
                continue
            delays = key[3] + (action != free)
            if self.b.delays is not None and delays > self.b.delays:
                continue
            self.transitions += 1
            try:
                after, footprint = self._step(c, action)
            except Exception as error:  # the core is total: a transition that raises is a bug
                return self._fail("exception", key, [], then=action, error=error)
            faults = key[1] + (action.fault is not cluster.Fault.NONE)
            crashes = key[2] + (action.kind is Kind.CRASH)
            k2: Key = (self.prints.state(after), faults, crashes, delays)
            if action == fair:
                self._follows(key[0], records, k2[0], after)
                fair = None
            sleep = {
                b: f
                for b, f in (*asleep.items(), *done)
                if f is not None and independent(f, footprint)
            }
            done.append((action, footprint))
            pending = self.next_sleep.get(k2)
            if pending is not None:  # another arrival in this layer: both must be covered
                self.next_sleep[k2] = {b: f for b, f in pending.items() if b in sleep}
                continue
            if self._dominated(k2):
                continue
            self._admit(k2, key, action)
            self.next_sleep[k2] = sleep
            if bad := self._judge(after):
                return self._fail("violation", k2, bad)
            layer.append((k2, after))
        if fair is not None:  # asleep here: its successor is reached by another order
            try:
                after = self.steps.state(c, fair)
            except Exception as error:  # the core is total: a transition that raises is a bug
                return self._fail("exception", key, [], then=fair, error=error)
            self._follows(key[0], records, self.prints.state(after), after)
        return None

    def _actions(self, key: Key, c: cluster.Cluster, free: Action | None) -> list[Action]:
        """What may happen next: every enabled action, or with the delay budget spent only
        the free one (which is always enabled: any other would cost a delay)."""
        if self.b.delays is not None and key[3] >= self.b.delays:
            return [] if free is None else [free]
        return enabled(
            c,
            faults_left=self.b.faults - key[1],
            crashes_left=self.b.crashes - key[2],
            store_faults_only=self.b.store_faults_only,
            max_time_s=self.b.max_time_s,
            fifo=self.b.fifo,
            crashable=frozenset(self.b.crashable) or None,
            capture_faults=self.b.capture_faults,
            store_faults=self.b.store_faults,
            forge=self.b.forge,
        )

    def _free_action(self, c: cluster.Cluster) -> Action | None:
        """The action that costs no delay (``Bounds.delays``): the fair run's next one,
        except that a crashed node restarts once the others have nothing left to do but
        wait (restarting it earlier is a delay, like any other choice)."""
        fair = progress.fair_action(c, self.b.max_time_s)
        down = [name for name in sorted(c.nodes) if not c.nodes[name].alive]
        if down and (fair is None or fair.kind is Kind.TICK):
            return Action(kind=Kind.RESTART, node=down[0])
        return fair

    def _step(self, c: cluster.Cluster, action: Action) -> tuple[cluster.Cluster, Footprint | None]:
        """The next state, and what the action touched (None: it may depend on anything)."""
        after, footprint = self.steps.take(c, action)
        if self._records(after) >= self.b.rounds:  # it ends exploration: no sibling commutes
            return after, None
        return after, footprint

    def _records(self, c: cluster.Cluster) -> int:
        """How many records the tape holds, remembered per store (many states share one)."""
        if c.hostile:  # outsiders' objects are not part of the tape (never in a search yet)
            return len(cluster.records(c))
        key = self.prints.store(c.store)
        count = self.tape_lengths.get(key)
        if count is None:
            count = self.tape_lengths[key] = len(cluster.records(c))
        return count

    def _sampled(self, key: Key) -> bool:
        every = self.b.progress_every
        return every > 0 and int.from_bytes(key[0][:4], "big") % every == 0

    def _progresses(self, c: cluster.Cluster) -> bool:
        if not progress.expects_progress(c):
            return True
        self.progress_checks += 1
        try:
            committed, _ = progress.fair_commits(c, self.b.progress_within_s, self.steps.state)
        except Exception:  # reported with its trace by counterexample()
            return False
        return committed

    def _fair_action(self, fingerprint: bytes, c: cluster.Cluster, records: int) -> Action | None:
        """The fair run's first action from ``c`` when it is one the search takes here.

        Otherwise (the round bound reached, the next timer beyond the clock bound, a
        crashed node to restart first) the fair run is run out now.
        """
        self.now_at[fingerprint] = c.now_s
        if records < self.b.rounds and progress.healed(c) is c:
            action = progress.fair_action(c, self.b.max_time_s)
            if action is not None:
                return action
        try:
            self.commit_at[fingerprint] = self.fair.next_commit_s(c, fingerprint)
        except Exception:  # reported with its trace by counterexample()
            self.commit_at[fingerprint] = None
        return None

    def _follows(
        self, fingerprint: bytes, records: int, then: bytes, after: cluster.Cluster
    ) -> None:
        """The fair run from ``fingerprint``'s state steps to ``then``'s (``after``)."""
        self.fair_next[fingerprint] = (then, self._records(after) > records, after.now_s)

    def _not_live(self) -> Outcome | None:
        """The first state, breadth first, whose fair run does not commit in time.

        Each state's fair run was either run out (``commit_at``) or begins with a step
        to another state the search reached (``fair_next``): its answer is that
        state's, or the time of that step if it committed. A chain that comes back
        to a state it passed goes round at one instant (the clock is part of the
        fingerprint): it never commits.
        """
        if not self.b.liveness:
            return None
        for start in self.fair_next:
            chain: list[bytes] = []
            at: bytes = start
            passed: set[bytes] = set()
            while at not in self.commit_at:
                if at in passed:
                    answer = None
                    break
                passed.add(at)
                chain.append(at)
                then, committed, when = self.fair_next[at]
                if committed:
                    answer = when
                    break
                at = then
            else:
                answer = self.commit_at[at]
            for passing in chain:
                self.commit_at[passing] = answer
        within = self.b.progress_within_s
        for key in self.parents:
            commit_s = self.commit_at[key[0]]
            if commit_s is None or commit_s - self.now_at[key[0]] > within:
                return self._fail("not live", key, [])
        return None

    def _dominated(self, key: Key) -> bool:
        """Seen with at most this much budget spent: nothing new can happen from here."""
        seen = self.budgets.setdefault(key[0], [])
        if any(all(was <= now for was, now in zip(spent, key[1:], strict=True)) for spent in seen):
            return True
        seen.append(key[1:])
        return False

    def _admit(self, key: Key, parent: Key | None, action: Action | None) -> None:
        self.parents[key] = (parent, action)
        self.budgets.setdefault(key[0], [])
        if key[1:] not in self.budgets[key[0]]:
            self.budgets[key[0]].append(key[1:])

    def _judge(self, c: cluster.Cluster) -> list[invariants.Violation]:
        """Every invariant, each answer remembered by what it reads: those over the store
        alone per store fingerprint, those judged node by node per store fingerprint and
        node digest, any others per store fingerprint and every node digest (none of them
        reads the clock, the commands in flight, the etags or a mapping's order, which
        the fingerprint leaves out: a state is judged once per fingerprint anyway)."""
        store_key = self.prints.store(c.store)
        base: invariants.ClusterView | None = None
        found = self.store_verdicts.get(store_key)
        if found is None:
            base = cluster.view(c)
            found = self.store_verdicts[store_key] = checks.judge(base, checks.store_part())
        found = checks.recorded(c) + found
        part = self.prints.digests.part  # the state's own parts: the fingerprint has them
        names = sorted(c.nodes)
        for name in names:
            node_key = (store_key, part(c.nodes[name]))
            over_node = self.node_verdicts.get(node_key)
            if over_node is None:
                base = base or cluster.view(c)
                over_node = self.node_verdicts[node_key] = checks.judge(
                    checks.one_node(base, name), self.per_node
                )
            found += over_node
        if self.whole:
            whole_key = (store_key, *(part(c.nodes[name]) for name in names))
            over_all = self.whole_verdicts.get(whole_key)
            if over_all is None:
                over_all = self.whole_verdicts[whole_key] = checks.judge(
                    base or cluster.view(c), self.whole
                )
            found += over_all
        if len(names) > 1:  # a message about the store alone came once per node
            found = list(dict.fromkeys(found))
        return found

    def _outcome(self, verdict: str, example: Counterexample | None = None) -> Outcome:
        return Outcome(
            verdict=verdict,
            states=len(self.parents),
            transitions=self.transitions,
            depth=self.depth,
            progress_checks=self.progress_checks,
            fair_runs=self.fair.runs,
            max_records=self.max_records,
            distinct=len(self.budgets),
            counterexample=example,
        )

    def _fail(
        self,
        kind: str,
        key: Key,
        bad: list[invariants.Violation],
        then: Action | None = None,
        error: Exception | None = None,
    ) -> Outcome:
        path: list[Action] = [] if then is None else [then]
        cursor: Key | None = key
        while cursor is not None:
            parent, action = self.parents[cursor]
            if action is not None:
                path.append(action)
            cursor = parent
        path.reverse()
        example = counterexample(self.b, kind, tuple(path), tuple(bad))
        return self._outcome(kind, example)


def step(c: cluster.Cluster, action: Action, bounds: Bounds) -> cluster.Cluster:
    """Apply one action, then (with ``atomic_payloads``) the payload work it started."""
    return settle(apply(c, action), bounds)


def settle(c: cluster.Cluster, bounds: Bounds) -> cluster.Cluster:
    if not bounds.atomic_payloads:
        return c
    return settle_payloads(c, hold_captures=bounds.capture_faults)


def counterexample(
    bounds: Bounds,
    kind: str,
    path: tuple[Action, ...],
    bad: tuple[invariants.Violation, ...],
) -> Counterexample:
    """Replay ``path`` from the initial state and narrate it, one line per action."""
    lines, c = narrate(bounds, path)
    if kind == "no progress" and c is not None:
        lines.extend(_stall(bounds, c))
    if kind == "not live" and c is not None:
        healed = progress.healed(c)
        if healed is not c:
            lines.append("then every crashed node restarts")
        lines.extend(_stall(bounds, healed))
    lines.extend(f"VIOLATED {v.invariant}: {v.message}" for v in bad)
    return Counterexample(
        kind=kind, tokens=tuple(a.token() for a in path), lines=tuple(lines), violations=bad
    )


def _stall(bounds: Bounds, c: cluster.Cluster) -> list[str]:
    """What the fair run from the last state did: nothing committed, or it raised."""
    try:
        _, end = progress.fair_commits(c, bounds.progress_within_s, lambda x, a: step(x, a, bounds))
    except Exception as error:  # the core is total: report, never propagate
        return [f"then a fair run without faults raised {type(error).__name__}: {error}"]
    lines = [
        f"then a fair run without faults for {bounds.progress_within_s:g}s commits nothing:"
        f" still {len(cluster.records(end))} records at t={end.now_s:g}s"
    ]
    return lines + [f"    {line}" for line in machine_summary(end)]


def narrate(bounds: Bounds, path: tuple[Action, ...]) -> tuple[list[str], cluster.Cluster | None]:
    """One line per action from the initial state; None as the state if an action raised."""
    c = initial_state(bounds)
    lines = [f"start {', '.join(sorted(c.nodes))} at t=0s"]
    for i, action in enumerate(path, 1):
        lines.append(f"{i:3d}. t={c.now_s:<6g} {describe(c, action)}")
        try:
            c = step(c, action, bounds)
        except Exception as error:  # the core is total: a transition that raises is the bug
            lines.append(f"RAISED {type(error).__name__}: {error}")
            return lines, None
    return lines, c


def machine_summary(c: cluster.Cluster) -> list[str]:
    out = []
    for name, node in sorted(c.nodes.items()):
        parts: Mapping[str, object] = {
            "alive": node.alive,
            "learner": node.learner.phase.value if node.learner else "-",
            "closer": node.closer.phase.value if node.closer else "-",
            "round": node.closer.round if node.closer else "-",
        }
        out.append(f"{name}: " + " ".join(f"{k}={v}" for k, v in parts.items()))
    return out
