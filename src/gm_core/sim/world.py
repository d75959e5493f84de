"""The deterministic simulator: a cluster of real state machines on a virtual clock.

Theory of operation
-------------------
:mod:`gm_core.cluster` carries out commands the instant a driver asks; this world
is the driver that gives every action a time. It keeps one priority queue of
future happenings ordered by ``(time, sequence)``:

* a command completes: after its store latency (:mod:`gm_core.sim.store`), with
  its fate drawn when it was issued — done, failed, throttled, cut off, or done
  with the response lost — and fed back through :func:`cluster.deliver`;
* a machine's timer fires (the cluster records each ``WakeAt``);
* a learner reaches the step its core asked to hear about (:class:`Pace`): the
  world plans each stretch of steps at once (:mod:`gm_core.sim.speed`) and trains
  the learner up to any moment before anything else touches it;
* a scheduled fault begins (crash, restart, join, close, poison, hostile write);
  pauses, slowdowns and cut-offs are intervals consulted when steps are planned
  and requests issued.

After every action the world looks at what the touched node asked for — new
commands in flight, a changed timer, a changed pace — and queues their times.
Ties break by insertion order and every collection is iterated in sorted or
insertion order, so one seed gives one run: every action is folded into a
blake2b *trace hash*, which the determinism test compares across runs.

Invariants are checked after every action (policy ``every``): the invariants
that read only the store are rerun only after an action that changed what they
read (a record, snapshot or claim created, a key deleted, an overwrite of
anything but a lease or the head hint); the others run every time. The first
violation stops the run and is reported with the last actions and the seed that
replays it.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import heapq
from collections.abc import Callable, Mapping
from typing import cast

import attrs
import numpy as np

from gm_core import closer, cluster, codec, invariants, keys, learner
from gm_core.commands import Align, Capture, Command, List, Merge, PutOnce, PutOver
from gm_core.records import RoundRecord, TensorSpec
from gm_core.sim import checks, speed
from gm_core.sim.metrics import Ledger, Sample, Span, Summary, Tally, settled, summarize
from gm_core.sim.scenario import CheckPolicy, Fault, FaultKind, Scenario
from gm_core.sim.store import Throttle, is_write, latency_s, requests_of
from gm_core.sim.training import Trainer, schema_of
from gm_core.store_model import ModelStore

L, C = cluster.Machine.LEARNER, cluster.Machine.CLOSER

TRACE_TAIL = 40
BUSY_TICK_S = 1e-3

Key = tuple[str, cluster.Machine, int, int]


@attrs.frozen(kw_only=True)
class Progress:
    now_s: float
    duration_s: float
    records: int
    actions: int


@attrs.frozen(kw_only=True)
class Report:
    """The outcome of one run: its summary, its trace hash, and any violation."""

    scenario: Scenario
    actions: int
    trace_hash: str
    summary: Summary
    violations: tuple[invariants.Violation, ...] = ()
    violation_at_s: float | None = None
    trace_tail: tuple[str, ...] = ()
    busy_wakes: int = 0
    step_s: Mapping[str, float] = attrs.field(factory=dict)
    """Each learner's mean step time (its speed, before stalls)."""
    step_ends: Mapping[str, tuple[float, ...]] = attrs.field(factory=dict)
    """When each of a learner's steps ended, its incarnations one after the other (what
    :mod:`gm_core.sim.consume` reads a dataset's consumption from)."""

    @property
    def ok(self) -> bool:
        return not self.violations


@attrs.define(kw_only=True)
class Segment:
    """A planned stretch of a learner's steps toward its pace target."""

    pace: object
    ends: np.ndarray
    work: np.ndarray
    done: int = 0


def run(scenario: Scenario, on_progress: Callable[[Progress], None] | None = None) -> Report:
    """Simulate ``scenario`` to its duration (or its first violation)."""
    return _World(scenario, on_progress).run()


def roles_of(scenario: Scenario) -> dict[str, frozenset[cluster.Machine]]:
    roles = {name: frozenset({L}) for name in speed.learner_names(scenario.learners)}
    for name in speed.closer_names(scenario):
        roles[name] = roles.get(name, frozenset()) | {C}
    return roles


def abstract_schema(scenario: Scenario) -> tuple[TensorSpec, ...]:
    """Equal tensors, at least one per fragment: shapes are irrelevant to abstract payloads."""
    count = max(2, scenario.config.fragments)
    return tuple(TensorSpec(name=f"block.{i}", shape=(4,), dtype="F32") for i in range(count))


def create_cluster(scenario: Scenario) -> cluster.Cluster:
    learner_options = learner.LearnerOptions(
        poll_s=scenario.poll_s, renew_s=scenario.renew_s, close_timeout_s=4 * scenario.renew_s
    )
    closer_options = closer.CloserOptions(poll_s=scenario.poll_s, renew_s=scenario.renew_s)
    schema = schema_of(scenario.training) if scenario.training else abstract_schema(scenario)
    return cluster.create(
        scenario.config,
        roles_of(scenario),
        schema=schema,
        learner_options=learner_options,
        closer_options=closer_options,
    )


class _Ev(enum.IntEnum):
    START = 0
    CRASH = 1
    CLOSE = 2
    POISON = 3
    HOSTILE = 4
    COMPLETE = 5
    TIMER = 6
    STEP = 7
    SAMPLE = 8
    END = 9


_FAULT_EVENTS = {
    FaultKind.CRASH: _Ev.CRASH,
    FaultKind.JOIN: _Ev.START,
    FaultKind.CLOSE: _Ev.CLOSE,
    FaultKind.POISON: _Ev.POISON,
    FaultKind.HOSTILE: _Ev.HOSTILE,
}


class _World:
    """The run in progress: the cluster value plus the queue and tallies around it.

    This is the one mutable object of a run; it lives inside :func:`run` and owns
    the generators spawned from the scenario's seed.
    """

    def __init__(self, scenario: Scenario, on_progress: Callable[[Progress], None] | None):
        self.s = scenario
        self.on_progress = on_progress
        root = np.random.default_rng(scenario.seed)
        store_rng, fault_rng, speed_rng, train_rng, steps_root = root.spawn(5)
        self.store_rng, self.fault_rng = store_rng, fault_rng
        self.c = create_cluster(scenario)
        self.learners = speed.learner_names(scenario.learners)
        means = speed.mean_step_s(scenario.speed, len(self.learners), speed_rng)
        self.mean_s = dict(zip(self.learners, means, strict=True))
        self.step_rngs = dict(zip(self.learners, steps_root.spawn(len(self.learners)), strict=True))
        drawn = speed.random_faults(
            scenario.random_faults,
            tuple(sorted(self.c.nodes)),
            frozenset(self.learners),
            scenario.duration_s,
            fault_rng,
        )
        self.faults = tuple(sorted((*scenario.faults, *drawn), key=_fault_order))
        self.slowdowns = {n: speed.intervals_of(self.faults, n) for n in self.c.nodes}
        self.cutoffs = {
            n: speed.intervals_of(self.faults, n, (FaultKind.CUTOFF,)) for n in self.c.nodes
        }
        self.trainer = (
            Trainer(scenario.training, scenario.config, self.learners, train_rng)
            if scenario.training
            else None
        )
        self.throttle = Throttle(scenario.store.throttle_rps)
        self.tally = Tally(step_s=dict(self.mean_s))
        self.queue: list[tuple[float, int, _Ev, tuple[object, ...]]] = []
        self.seq = 0
        self.issued: set[Key] = set()
        self.timer_at: dict[tuple[str, cluster.Machine], float] = {}
        self.fired_at: dict[tuple[str, cluster.Machine], float] = {}
        self.segments: dict[str, Segment | None] = {}
        self.created_at: dict[str, float] = {}
        self.committed_s = 0.0
        self.ledger = Ledger()
        self.captures: dict[Key, Span] = {}
        self.actions = 0
        self.busy_wakes = 0
        self.hasher = hashlib.blake2b(digest_size=16)
        self.tail: collections.deque[str] = collections.deque(maxlen=TRACE_TAIL)
        self.store_dirty = True
        self.violations: list[invariants.Violation] = []

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> Report:
        self._schedule_start()
        end = self.s.duration_s
        next_progress = 0.0
        while self.queue:
            t, _, kind, data = heapq.heappop(self.queue)
            if t > end or kind is _Ev.END:
                break
            self._at(t)
            touched = self._dispatch(kind, data)
            if touched is None:
                continue
            self.actions += 1
            if self.s.check is CheckPolicy.EVERY and self._check(touched):
                break
            if self.on_progress is not None and t >= next_progress:
                self.on_progress(self._progress())
                next_progress = t + end / 200
        return self._finish()

    def _schedule_start(self) -> None:
        joins = {f.node for f in self.faults if f.kind is FaultKind.JOIN}
        for name in sorted(self.c.nodes):
            if name not in joins:
                self._push(0.0, _Ev.START, (name,))
        for fault in self.faults:
            kind = _FAULT_EVENTS.get(fault.kind)
            if kind is not None:
                self._push(fault.at_s, kind, (fault.node, fault.duration_s))
        self._push(self.s.duration_s, _Ev.END, ())
        if self.s.sample_s:
            self._push(self.s.sample_s, _Ev.SAMPLE, ())

    def _push(self, t: float, kind: _Ev, data: tuple[object, ...]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, kind, data))

    def _at(self, t: float) -> None:
        if t != self.c.now_s:
            self.c = attrs.evolve(self.c, now_s=t)

    def _trace(self, line: str) -> None:
        text = f"{self.c.now_s:.6f} {line}"
        self.hasher.update(text.encode() + b"\n")
        self.tail.append(text)

    def _progress(self) -> Progress:
        return Progress(
            now_s=self.c.now_s,
            duration_s=self.s.duration_s,
            records=len(self.tally.commits),
            actions=self.actions,
        )

    # --- actions ---------------------------------------------------------------------------------

    def _dispatch(self, kind: _Ev, data: tuple[object, ...]) -> str | None:
        """Carry out one queued happening; the touched node's name, or None if it was moot."""
        if kind is _Ev.SAMPLE:
            self._sample()
            return None
        name = str(data[0]) if data else ""
        handlers: dict[_Ev, Callable[[tuple[object, ...]], bool]] = {
            _Ev.START: self._start,
            _Ev.CRASH: self._crash,
            _Ev.CLOSE: self._close,
            _Ev.POISON: self._poison,
            _Ev.HOSTILE: self._hostile,
            _Ev.COMPLETE: self._complete,
            _Ev.TIMER: self._timer,
            _Ev.STEP: self._step,
        }
        if not handlers[kind](data):
            return None
        if name in self.c.nodes:
            self._observe(name)
        return name

    def _start(self, data: tuple[object, ...]) -> bool:
        name = str(data[0])
        if self.c.nodes[name].alive:
            return False
        self._trace(f"start {name}")
        now = self.c.now_s
        if name in self.mean_s:
            self.tally.joined_s.setdefault(name, now)
            since = self.tally.down_since.pop(name, None)
            if since is not None:
                self.tally.down_s[name] = self.tally.down_s.get(name, 0.0) + now - since
            if self.trainer is not None:
                self.trainer.start(name)
        self.c = cluster.start(self.c, name)
        return True

    def _crash(self, data: tuple[object, ...]) -> bool:
        name, down_s = str(data[0]), float(data[1])  # type: ignore[arg-type]
        if not self.c.nodes[name].alive:
            return False
        self._sync(name)
        self._trace(f"crash {name} for {down_s:.3f}s")
        self.segments[name] = None
        self.c = cluster.crash(self.c, name)
        if name in self.mean_s:
            self.tally.down_since[name] = self.c.now_s
        if down_s > 0:
            self._push(self.c.now_s + down_s, _Ev.START, (name,))
        return True

    def _close(self, data: tuple[object, ...]) -> bool:
        name = str(data[0])
        if not self.c.nodes[name].alive:
            return False
        self._sync(name)
        self._trace(f"close {name}")
        if name in self.mean_s:
            self.tally.left_s.setdefault(name, self.c.now_s)
        self.c = cluster.close(self.c, name)
        return True

    def _poison(self, data: tuple[object, ...]) -> bool:
        name = str(data[0])
        self._trace(f"poison {name}")
        self.c = cluster.set_poison(self.c, name, True)
        return True

    def _hostile(self, data: tuple[object, ...]) -> bool:
        newest = len(self.tally.commits)
        blob = bytes(self.fault_rng.integers(0, 256, 24, dtype=np.uint8))
        choices = (
            keys.snapshot(newest, "intruder"),
            f"{keys.snapshot_prefix(newest)}not a key",
            keys.claim(newest, 9000),
        )
        key = choices[int(self.fault_rng.integers(0, len(choices)))]
        self._trace(f"hostile write {key}")
        self.c = cluster.inject(self.c, key, blob)
        self.store_dirty = True
        self.created_at.setdefault(key, self.c.now_s)
        return True

    def _timer(self, data: tuple[object, ...]) -> bool:
        name, machine, at = str(data[0]), cluster.Machine(str(data[1])), data[2]
        node = self.c.nodes[name]
        if not node.alive or node.timers.get(machine) != at:
            return False
        self._sync(name)
        self._trace(f"timer {name}/{machine}")
        self.timer_at.pop((name, machine), None)
        self.fired_at[(name, machine)] = self.c.now_s
        self.c = cluster.fire(self.c, name, machine)
        return True

    def _step(self, data: tuple[object, ...]) -> bool:
        name = str(data[0])
        if self.segments.get(name) is not data[1]:
            return False
        self._sync(name)
        self._trace(f"stepped {name} to {self.c.nodes[name].step}")
        return True

    def _complete(self, data: tuple[object, ...]) -> bool:
        key = cast(Key, data[1])
        fault = data[2]
        assert isinstance(fault, cluster.Fault)
        self.issued.discard(key)
        index = self._find(key)
        if index is None:
            return False
        item = self.c.inflight[index]
        self._sync(item.node)
        cmd = item.command
        self._trace(f"{item.node}/{item.machine} {_describe(cmd)} -> {fault}")
        if fault is not cluster.Fault.FAIL:
            self._before_effect(item.node, cmd, self.captures.pop(key, None))
        before = self.c.store
        self.c = self._deliver(index, cmd, fault)
        self.store_dirty |= self._touches_invariants(cmd, before)
        if isinstance(cmd, PutOnce):
            self._created(cmd)
        return True

    def _find(self, key: Key) -> int | None:
        name, machine, incarnation, req = key
        for i, item in enumerate(self.c.inflight):
            if (
                item.node == name
                and item.machine is machine
                and item.incarnation == incarnation
                and getattr(item.command, "req", None) == req
            ):
                return i
        return None

    def _deliver(self, index: int, cmd: Command, fault: cluster.Fault) -> cluster.Cluster:
        """Deliver; a listing sees only keys older than the store's list lag."""
        lag = self.s.store.list_lag_s
        if not isinstance(cmd, List) or lag <= 0:
            return cluster.deliver(self.c, index, fault)
        real = self.c.store
        cutoff = self.c.now_s - lag
        visible = {k: v for k, v in real.objects.items() if self.created_at.get(k, -1.0) <= cutoff}
        lagged = attrs.evolve(self.c, store=attrs.evolve(real, objects=visible))
        return attrs.evolve(cluster.deliver(lagged, index, fault), store=real)

    def _before_effect(self, name: str, cmd: Command, span: Span | None) -> None:
        """Name the payload the cluster is about to write: its steps, and its tensors."""
        node = self.c.nodes[name]
        if isinstance(cmd, Capture):
            data = cluster.payload_bytes("delta", name, cmd.round, node.step)
            digest = cluster.digest_of(data + (cluster.POISON if node.poison else b""))
            if span is not None:
                self.ledger.spans[digest] = span
            if self.trainer is not None:
                self.trainer.register(name, cmd.round, digest, node.poison)
        if self.trainer is None:
            return
        if isinstance(cmd, Merge):
            if all(c.payload.digest in self.trainer.tensors for c in cmd.contributions):
                cosine = self.trainer.merge(cmd)
                if cosine is not None:
                    self.c = cluster.set_cosine(self.c, cmd.round, cosine)
        elif isinstance(cmd, Align) and self.c.store.get(cmd.theta.key) is not None:
            self.trainer.align(name, cmd)

    def _created(self, cmd: PutOnce) -> None:
        """Note creation times (for list lag) and commits (for metrics and the loss curve)."""
        if cmd.key in self.created_at or self.c.store.get(cmd.key) is None:
            return
        self.created_at[cmd.key] = self.c.now_s
        if not cmd.key.startswith(keys.ROUNDS_PREFIX):
            return
        record = codec.decode(RoundRecord, cmd.data)
        self.tally.commits[record.round] = self.c.now_s
        self._credit(record)
        if self.trainer is not None:
            thetas = tuple(fs.theta.digest for fs in record.frontier)
            loss = self.trainer.committed_loss(thetas)
            self.tally.losses.append((self.c.now_s, record.round, loss))

    def _credit(self, record: RoundRecord) -> None:
        """Credit the steps the record's deltas carry that no earlier commit carried."""
        p = self.s.config.fragments
        for x in record.participants:
            snapshot = cluster.snapshot(self.c, record.round, x.learner)
            if snapshot is None:
                continue
            span = self.ledger.spans.get(snapshot.payload.digest)
            if span is not None:
                steps = self.ledger.credit(span)
                self.committed_s += steps * self.tally.step_s.get(x.learner, 0.0) / p

    # --- what a node asked for ---------------------------------------------------------------

    def _observe(self, name: str) -> None:
        """Queue the times of whatever ``name``'s machines just asked for."""
        node = self.c.nodes[name]
        fresh = []
        for item in reversed(self.c.inflight):
            key = _key(item)
            if key in self.issued:
                break
            fresh.append(item)
        for item in reversed(fresh):
            self._issue(item)
        if not node.alive:
            for machine in (L, C):
                self.timer_at.pop((name, machine), None)
            return
        for machine, at in sorted(node.timers.items()):
            if self.timer_at.get((name, machine)) != at:
                self.timer_at[(name, machine)] = at
                self._push(self._wake_time(name, machine, at), _Ev.TIMER, (name, machine.value, at))
        if node.learner is not None:
            self._plan(name)

    def _wake_time(self, name: str, machine: cluster.Machine, at: float) -> float:
        """When to fire a timer; one re-armed for the instant it just fired waits a tick.

        A machine that asks to be woken now, right after being woken now, would
        spin a real shell; the world counts it and lets a millisecond pass.
        """
        now = self.c.now_s
        if at <= now and self.fired_at.get((name, machine)) == now:
            self.busy_wakes += 1
            return now + BUSY_TICK_S
        return max(at, now)

    def _issue(self, item: cluster.InFlight) -> None:
        """Decide a command's fate and latency now, and queue its completion."""
        key = _key(item)
        self.issued.add(key)
        cmd, now, profile = item.command, self.c.now_s, self.s.store
        if isinstance(cmd, Capture):
            self._capture_issued(key, item, cmd)
        reqs = requests_of(cmd, profile.fragment_bytes)
        draw = float(self.store_rng.random())
        fault = cluster.Fault.NONE
        cut_off = self.cutoffs[item.node].at(now)[0] != 1.0
        if cut_off or not self.throttle.admit(reqs.classes, now) or draw < profile.fail_rate:
            fault = cluster.Fault.FAIL
        elif is_write(cmd) and draw < profile.fail_rate + profile.lost_rate:
            fault = cluster.Fault.LOSE_RESPONSE
        self.tally.count(reqs.classes, fault is not cluster.Fault.NONE)
        delay = latency_s(profile, reqs, self.store_rng)
        self._push(now + delay, _Ev.COMPLETE, (item.node, key, fault))

    def _capture_issued(self, key: Key, item: cluster.InFlight, cmd: Capture) -> None:
        """The shell copies the fragment when the capture is issued: note its steps now."""
        state = self.c.nodes[item.node].learner
        out = state.outgoing.get(cmd.round) if state is not None else None
        if out is None:
            return
        self.captures[key] = Span(
            learner=item.node,
            incarnation=item.incarnation,
            fragment=cmd.fragment,
            start=out.step - out.steps,
            end=out.step,
        )
        if self.trainer is not None:
            self.trainer.snap(item.node, cmd.round, cmd.fragment)

    def _plan(self, name: str) -> None:
        """Plan the learner's steps up to its pace target, unless already planned for it."""
        node = self.c.nodes[name]
        pace, old = node.pace, self.segments.get(name)
        if pace is None or pace.stalled:
            self.segments[name] = None
            return
        if old is not None and old.pace == pace:
            return
        steps = max(pace.next_step - node.step, 1)  # a barrier passed: the next step
        ends, work = speed.plan_steps(
            self.c.now_s,
            steps,
            self.mean_s[name],
            self.s.speed.jitter,
            self.slowdowns[name],
            self.step_rngs[name],
        )
        segment = Segment(pace=pace, ends=ends, work=work)
        self.segments[name] = segment
        self._push(float(ends[-1]), _Ev.STEP, (name, segment))

    def _sync(self, name: str) -> None:
        """Train ``name`` through every planned step that has ended by now."""
        segment = self.segments.get(name)
        if segment is None:
            return
        done = int(np.searchsorted(segment.ends, self.c.now_s, side="right"))
        new = done - segment.done
        if new <= 0:
            return
        incarnation = self.c.nodes[name].incarnation
        ends = [float(t) for t in segment.ends[segment.done : done]]
        self.tally.trained(name, float(segment.work[segment.done : done].sum()), ends, incarnation)
        if self.trainer is not None:
            self.trainer.train(name, new)
        segment.done = done
        if done == len(segment.ends):
            self.segments[name] = None
        self.c = cluster.train(self.c, name, new, self.s.tokens_per_step)

    # --- checking, sampling, finishing ---------------------------------------------------------

    def _check(self, touched: str) -> bool:
        """Check the invariants after an action; True when one is broken (the run stops)."""
        names = checks.node_part()
        if self.store_dirty:
            names += checks.store_part()
            self.store_dirty = False
        found = checks.recorded(self.c) + checks.judge(cluster.view(self.c), names)
        if not found:
            return False
        self.violations = found
        self._trace(f"VIOLATION after touching {touched}: {found[0].invariant}")
        return True

    def _touches_invariants(self, cmd: Command, before: ModelStore) -> bool:
        """Whether delivering ``cmd`` changed what the store-only invariants read.

        They read the create-once history and which keys exist. A payload a capture
        or merge creates is content-addressed and unreferenced until a record or
        snapshot points at it, so it can break none of them; leases and the head
        hint are read by none. Everything else that changed the store counts.
        """
        if self.c.store is before or isinstance(cmd, Capture | Merge):
            return False
        if isinstance(cmd, PutOver):
            return not (cmd.key.startswith(keys.LEASES_PREFIX) or cmd.key == keys.head())
        return True

    def _sample(self) -> None:
        now = self.c.now_s
        for name in sorted(self.segments):
            self._sync(name)
            if self.c.nodes[name].alive:
                self._observe(name)
        self.tally.samples.append(
            Sample(
                time_s=now,
                committed_s=self.committed_s,
                capacity_s=self.tally.capacity_s(now),
                records=len(self.tally.commits),
            )
        )
        if self.s.sample_s:
            self._push(now + self.s.sample_s, _Ev.SAMPLE, ())

    def _finish(self) -> Report:
        end = min(self.s.duration_s, max(self.c.now_s, 0.0))
        if not self.violations:
            self._at(max(self.c.now_s, end))
            for name in sorted(self.segments):
                self._sync(name)
        if not self.violations and self.s.check is not CheckPolicy.NONE:
            self.store_dirty = True
            self._check("(end)")
        records = cluster.records(self.c)
        p = self.s.config.fragments
        middle = settled(self.tally, self.ledger, p, self.c.now_s)
        summary = summarize(self.tally, records, self.committed_s, middle, self.c.now_s)
        return Report(
            scenario=self.s,
            actions=self.actions,
            trace_hash=self.hasher.hexdigest(),
            summary=summary,
            violations=tuple(self.violations),
            violation_at_s=self.c.now_s if self.violations else None,
            trace_tail=tuple(self.tail),
            busy_wakes=self.busy_wakes,
            step_s=dict(self.mean_s),
            step_ends={
                name: tuple(
                    t
                    for (n, _), ends in sorted(self.tally.step_ends.items())
                    for t in ends
                    if n == name
                )
                for name in self.learners
            },
        )


def _key(item: cluster.InFlight) -> Key:
    req = getattr(item.command, "req", -1)
    return (item.node, item.machine, item.incarnation, int(req))


def _describe(cmd: Command) -> str:
    """One short, deterministic line naming a command (for the trace)."""
    what = type(cmd).__name__
    key = getattr(cmd, "key", None) or getattr(cmd, "prefix", None)
    if key is None and hasattr(cmd, "round"):
        key = f"round={cmd.round}"
    return f"{what} {key} req={getattr(cmd, 'req', '-')}"


def _fault_order(f: Fault) -> tuple[float, str, str]:
    return (f.at_s, f.node, f.kind.value)
