"""The runtime: one event loop that owns the core's machines and carries out their commands.

Theory of operation
-------------------
A node runs a learner machine, a closer machine, or both
(:mod:`gm_core.learner`, :mod:`gm_core.closer`). Their states live here, on the
loop of a :class:`~gm_shell.loopthread.LoopThread`, and :meth:`Runtime._feed` —
always on that loop — is the only caller of their ``advance``. Every command
that comes back is carried out with real effects and its outcome, success or
failure, is fed back as an event stamped with this node's monotonic clock,
exactly as :mod:`gm_core.cluster` does against its model store:

- store commands map one to one onto :class:`~gm_shell.mailbox.Mailbox` calls;
- ``Capture`` is the training thread's (:mod:`gm_shell.pacer`): it copies the
  fragment at this very step — at a due step from a :class:`Plan` made ahead by
  :meth:`Runtime._forecast`, without waiting for the loop — and hands the copy
  over; the delta, encoding, hashing and the create-once upload then run off
  the loop;
- ``Verify`` fetches a snapshot's payload and judges it
  (:class:`~gm_shell.fragments.FragmentCodec`), keeping the decoded delta for
  the merge; ``Merge`` runs the merge and Nesterov step in a worker thread and
  writes the new theta (and momentum) create-once;
- ``Align`` fetches and decodes a commit off the loop, then hands it to the
  training thread, which folds it into the model at its next step and reports
  ``Aligned`` with that step;
- ``WakeAt`` replaces the machine's one timer; ``Pace`` goes to the pacer;
  ``Notify`` becomes a typed event (:mod:`gm_shell.events`);
- ``Share`` is fed at once to the node's other machine as ``Shared`` (a learner's
  once its feed commits, a closer's after its transition's other commands): its own
  snapshot reaches its closer, its own record its learner, without a listing or a
  probe (spec/protocol.md §6.4). On the same node the closer's ``Verify`` of its own
  learner's delta finds it decoded and judged already (:meth:`Runtime._encode_delta`;
  at most ``in_flight`` of them wait so: :meth:`Runtime._may_preload`).

The training thread talks to the loop through notes it leaves with the pacer
(a step with its copies, a capture, an applied commit). Every learner feed
feeds the waiting notes first, in order, and commits under the pacer's lock
only if no note came meanwhile (else it is computed again), so each note meets
the state the training thread saw (see :mod:`gm_shell.pacer`).

Any exception in carrying out a command becomes ``RequestFailed`` (a payload
judged unusable becomes ``Unusable``, naming its key); the core decides what to
do about it. The two machines of a node are isolated from each
other: an exception from a machine's ``advance`` (or in interpreting its
commands) is reported as a :class:`~gm_shell.events.MachineRestarted` event, and
that machine alone starts again from the tape — a fresh machine, fed ``Started``
after a backoff that doubles with each restart (1 s up to 60 s) — while the other
goes on. Outcomes of commands the old incarnation issued are dropped
(:attr:`Runtime._epochs`), so they are never mistaken for the new one's; a
learner's restart also voids the work and plan handed to the training thread,
which stalls until the fresh learner has joined (:meth:`Pacer.restart`). Only a
failure of the runtime itself (a planned step the core then disagrees with) stops
the node: the training thread raises it.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
import numpy as np

from gm_core import batch, closer, keys, learner, plan, schedule
from gm_core import members as core_members
from gm_core.auth import RunAuth, Signing
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Fetch,
    Get,
    List,
    Merge,
    Notify,
    Pace,
    Probe,
    PutOnce,
    PutOver,
    Share,
    Verify,
    WakeAt,
)
from gm_core.events import (
    Aligned,
    Captured,
    CloseRequested,
    Deleted,
    Event,
    GotObject,
    HeadRead,
    Listed,
    Merged,
    Probed,
    PutDone,
    RequestFailed,
    Shared,
    Started,
    Stepped,
    TimerFired,
    Unusable,
    Verified,
)
from gm_core.numerics import Contributions
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment, Manifest, PayloadRef, Requests
from gm_core.verdicts import normalized_weights
from gm_shell import events, members
from gm_shell.backends import Backend
from gm_shell.cache import FragmentCache
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.fragments import Merged as MergedArrays
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox, PutOutcome
from gm_shell.pacer import (
    ApplyWork,
    CaptureNote,
    CaptureWork,
    ForgetWork,
    Note,
    Pacer,
    Plan,
    StepNote,
    Work,
    queued_applies,
)
from gm_shell.payload import Sealed, bare_file_of
from gm_shell.reads import Reader
from gm_shell.replica import Prepared, Replica, Taken
from gm_shell.spill import Spill, Spilled
from gm_shell.stores import Backend as StoreBackend

LOG = logging.getLogger("gm")
T = TypeVar("T")


class Machine(enum.StrEnum):
    LEARNER = "learner"
    CLOSER = "closer"


def now() -> float:
    """This node's clock: monotonic, the same one the loop's timers use."""
    return time.monotonic()


def lease_epoch_us() -> int:
    """This node's wall clock minus :func:`now`, in µs: it makes the sequence numbers of the
    node's leases its wall clock, so they keep rising when the node restarts (§16.6)."""
    return time.time_ns() // 1000 - int(now() * 1_000_000)


RESTART_FIRST_S = 1.0
"""Delay before a machine that raised starts again from the tape; doubled per restart."""
RESTART_LONGEST_S = 60.0
"""The longest delay between restarts (a machine that raises at every start retries so)."""


_CARRYING = frozenset({Alignment.CARRY, Alignment.ADAPTIVE})
"""Rules under which a commit may be carried: the learner keeps a copy of each snapshot."""

OPTIMISTIC_TRIES = 3
"""Times a learner's feed is computed aside before it is done under the pacer's lock."""


class _CollidedError(Exception):
    """A feed computed aside must be done under the lock instead (see ``Runtime._feed``)."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


DELTA_CACHE_BYTES = 1 << 30
"""The most bytes of decoded deltas a closer keeps by default: those of rounds it has not
merged yet (a merge drops its own), which the run's learners and ``in_flight`` bound."""


class Runtime:
    """The machines of one node and the interpreter of their commands."""

    def __init__(
        self,
        *,
        node: str,
        manifest: Manifest,
        mailbox: Mailbox,
        codec: FragmentCodec,
        hub: events.EventHub,
        loop: LoopThread,
        replica: Replica | None,
        learner_options: learner.LearnerOptions | None,
        closer_options: closer.CloserOptions | None,
        cache_bytes: int | None,
        run_auth: RunAuth | None = None,
        spill: Spill | None = None,
    ) -> None:
        digest = plan.schema_digest(manifest.schema)
        self.node = node
        self.manifest = manifest
        self._digest = digest
        self._closer_options = closer_options
        self._run_auth = run_auth
        self._learner_options = learner_options
        self.learner = (
            learner.initial(node, manifest, digest, learner_options, run_auth)
            if replica is not None and learner_options is not None
            else None
        )
        self.closer = (
            closer.initial(node, manifest, digest, closer_options, run_auth)
            if closer_options
            else None
        )
        self._loop = loop  # before the pacer, which reads wake
        self.pacer = (
            Pacer(replica, self, keep_copies=manifest.config.alignment in _CARRYING)
            if replica is not None and self.learner is not None
            else None
        )
        self.learner_closed = threading.Event()
        self.failure: BaseException | None = None
        self.divergences = 0
        """Commits in a row that rejected this learner's delta as non-finite (loop thread
        writes, the training thread reads: see ``Session.step``)."""
        self.members: tuple[str, ...] = ()
        """The learners the newest aligned record's closer saw live (its membership)."""
        self._replica = replica
        self._planned: learner.LearnerState | None = None
        self._planned_applies: tuple[int, ...] = ()
        """The learner state and queued commits the pacer's plan was made from."""
        self._effects: list[Callable[[], None]] | None = None
        """Effects of the feed being computed, kept until it commits (see :meth:`_feed`)."""
        self._handovers: list[Callable[[], None]] = []
        """Its work, pace and plan for the pacer, handed over when it commits."""
        self._queued: list[Work] = []
        """The training thread's queue as the feed being computed leaves it."""
        self.feeds_redone = 0
        """Learner feeds computed again because the training thread moved meanwhile."""
        self._mailbox = mailbox
        self._codec = codec
        self._hub = hub
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"gm-compute-{node}")
        self._timers: dict[Machine, asyncio.TimerHandle] = {}
        self._epochs = dict.fromkeys(Machine, 0)
        """Incarnations of each machine: an outcome reaches only the one that asked for it."""
        self.restarts = dict.fromkeys(Machine, 0)
        """How often each machine raised and started again from the tape."""
        self._closing: set[Machine] = set()
        self._watching: asyncio.Task[None] | None = None
        """The look at ``members/`` every few seconds (per-node keys), while it runs."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading: dict[tuple[int, PayloadRef], asyncio.Future[Any]] = {}
        """Payload reads under way, by cache and reference: a second asker waits for the
        first read (a join's :class:`Fetch` and the load after it) instead of reading again."""
        self._reads = Reader(
            node=node,
            mailbox=mailbox,
            codec=codec,
            compute=self._compute,
            emit=hub.emit,
            clock=now,
            spill=spill,
        )
        self._reuses_uploads = mailbox.backend is not StoreBackend.MEMORY
        """Whether the bytes of a payload this node uploaded are its own again once the
        upload is done: a memory store keeps the very buffer it was given (as its object),
        which must then never be written (:func:`spare`, :meth:`_store_merged`)."""
        # A closer's deltas and momentum stay where it merges them (codec.device: torch's
        # accelerator, else the host); commits are host arrays, which a learner aligns from.
        # By default commits and momenta hold the newest of every fragment (the model's bytes
        # each, issue 12: memory proportional to the model): the base of the fragment's next
        # merge and the commit a learner aligns with next; an older one read again (a merge
        # redone, a learner behind) is downloaded again. Deltas are dropped once merged
        # (:meth:`_merge`): they hold the rounds not merged yet, capped.
        model = 4 * sum(codec.size(f) for f in range(len(codec.layouts)))
        newest = 1 if cache_bytes is None else None
        kept = model if cache_bytes is None else cache_bytes
        self._deltas: FragmentCache[PayloadRef, Any] = FragmentCache(
            cache_bytes or DELTA_CACHE_BYTES
        )
        self._commits: FragmentCache[PayloadRef, F32] = FragmentCache(kept, newest)
        self._momenta: FragmentCache[PayloadRef, Any] = FragmentCache(kept, newest)
        self._preloaded: list[PayloadRef] = []
        """This node's own deltas decoded for its closer as they were encoded (see
        :meth:`_may_preload`), oldest first; those merged since are dropped when counted."""
        self._preloading = 0
        """Captures being encoded with their delta decoded for the closer too."""

    # -- lifecycle (called from other threads) --------------------------------------------------

    def start(self, head: HeadRead | None = None) -> None:
        """Start the machines; ``head``: the head hint read for them (None: each reads it)."""
        self._loop.call(functools.partial(self._start, head))

    def _start(self, head: HeadRead | None) -> None:
        for machine in self._machines():
            self._feed(machine, Started(now_s=now(), head=head))

    def _machines(self) -> list[Machine]:
        present = [(Machine.LEARNER, self.learner), (Machine.CLOSER, self.closer)]
        return [machine for machine, state in present if state is not None]

    def request_close(self, machine: Machine, *, keep_lease: bool = False) -> None:
        """Close ``machine``; ``keep_lease``: a learner leaves the lease to its closer."""

        def close() -> None:
            self._closing.add(machine)  # a machine waiting to restart stays stopped
            self._feed(machine, CloseRequested(now_s=now(), keep_lease=keep_lease))

        self._loop.call(close)

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Cancel timers, let commands in flight finish (bounded), stop the loop and workers."""
        if self._loop.alive:
            self._loop.call(self._cancel_timers)
        self._loop.stop(grace_s)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _cancel_timers(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._watching is not None:  # it never ends by itself
            self._watching.cancel()

    # -- the pacer's link (called from the training thread) -------------------------------------

    def report(self, step: int, tokens: int) -> None:
        self._loop.call(
            lambda: self._feed(Machine.LEARNER, Stepped(now_s=now(), step=step, tokens=tokens))
        )

    @property
    def wake(self) -> Callable[[], None]:
        return self._loop.poster(self._drain)

    def amend_learner(self, change: Callable[[learner.LearnerState], learner.LearnerState]) -> None:
        """Replace the learner's state by ``change(state)`` between two transitions, and wait.

        Only for a core function that keeps what plans are made of (captures and pace):
        a restart laying saved progress back (:func:`gm_core.resume.resumed`).
        """

        def amend() -> None:
            assert self.learner is not None
            self.learner = change(self.learner)

        self._loop.call(amend)

    def watch_members(self, watch: members.Watch, every_s: float) -> None:
        """Look at ``members/`` every ``every_s`` seconds while the runtime runs, and put
        what the run authority says in force in both machines (spec/protocol.md §16.3.3)."""

        def start() -> None:
            self._watching = asyncio.get_running_loop().create_task(self._watch(watch, every_s))

        self._loop.call(start)

    async def _watch(self, watch: members.Watch, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                found = await watch.look(self._mailbox)
            except Exception as error:  # the store: look again next time
                LOG.warning("%s: reading members/ failed: %s", self.node, _describe(error))
                continue
            for event in found.events:
                self._hub.emit(event)
            if found.changed:
                self.learn_members(found.signing)

    def learn_members(self, signing: Signing) -> None:
        """Judge by ``signing`` from now on (loop thread, between two transitions): what
        the node learned of the members since the manifest. A restarted machine starts
        with it too."""
        if self._run_auth is not None:
            self._run_auth = attrs.evolve(self._run_auth, signing=signing)
        if self.learner is not None:
            envelope = core_members.reseal(self.learner.envelope, signing)
            self.learner = attrs.evolve(self.learner, envelope=envelope)
        if self.closer is not None:
            envelope = core_members.reseal(self.closer.envelope, signing)
            self.closer = attrs.evolve(self.closer, envelope=envelope)
        self._stop_if_revoked(signing)

    def _stop_if_revoked(self, signing: Signing) -> None:
        """Stop the runtime, by name, once ``signing`` says this node is revoked: from the
        round the revocation names everything it signs is refused, and its lease at once,
        so both machines would only spend requests (spec/protocol.md §16.3.3)."""
        from_round = signing.revoked_from.get(self.node)
        if from_round is None or self.failure is not None:
            return
        self._fail(
            members.RevokedError(
                f"{self.node} was revoked by the run authority from round {from_round}: "
                "it stops (the run refuses what it signs from that round on, its lease at "
                "once); start it again only under an id the authority admits"
            )
        )

    def _drain(self) -> None:
        self._feed(Machine.LEARNER, None)

    # -- feeding the machines (loop thread only) ------------------------------------------------

    def _feed(self, machine: Machine, event: Event | None) -> None:
        """Feed the training thread's notes, then ``event``, then plan the next due step.

        The learner's feed is a transaction against the pacer, so that the training thread
        never waits for a transition (a due step that found the lock held would hand the
        GIL to the loop and wait for it back). The transitions are computed without the
        lock, their effects kept aside (``advance`` is pure: nothing has happened yet);
        then, under the lock, if the training thread changed nothing the feed read (its
        notes, its queue: :attr:`Pacer.version`), the state and what it hands the pacer
        (work, pace, plan) are committed at once; its other effects (requests, timers,
        events) are carried out after, outside the lock. If it did, say by carrying out a
        due step meanwhile, the feed is computed again with its note first: the step
        happened before ``event`` was fed.
        A feed that restarts the learner or fails the runtime, or that keeps colliding with
        the training thread, is done the plain way, whole, under the lock.

        The closer's events need none of that: they change neither the learner's state
        nor the queue a plan is made from, so they are fed without the pacer's lock and
        leave the notes to the learner's next feed, which :meth:`wake` has already asked for.
        """
        pacer = self.pacer
        if pacer is None or machine is Machine.CLOSER:
            if event is not None:
                self._step(machine, event)
            return
        for _ in range(OPTIMISTIC_TRIES):
            version, notes, queued = pacer.view()
            start = self.learner, self._planned, self._planned_applies
            effects: list[Callable[[], None]] = []
            handovers: list[Callable[[], None]] = []
            self._effects, self._handovers, self._queued = effects, handovers, queued
            try:
                self._feed_learner(notes, event)
            except _CollidedError:
                break  # an exceptional feed: done the plain way below
            finally:
                self._effects = None
            with pacer.lock:
                committed = pacer.version == version
                if committed:
                    pacer.take_notes()
                    for handover in handovers:
                        handover()
            if committed:
                for effect in effects:  # requests, timers, events: nothing the pacer reads
                    effect()
                return
            self.learner, self._planned, self._planned_applies = start
            self.feeds_redone += 1
        self.learner, self._planned, self._planned_applies = start
        with pacer.lock:
            _, notes, self._queued = pacer.view()
            pacer.take_notes()
            self._feed_learner(notes, event)

    def _feed_learner(self, notes: list[Note], event: Event | None) -> None:
        """The notes in order, then ``event``, then the plan (effects per :meth:`_later` and
        :meth:`_hand_over`)."""
        epoch = self._epochs[Machine.LEARNER]
        for note in notes:
            if self._epochs[Machine.LEARNER] != epoch:
                break  # the learner restarted: notes made for the old one are void
            if isinstance(note, StepNote):
                self._feed_step(note)
            elif isinstance(note, CaptureNote):
                self._later(functools.partial(self._publish_note, note))
            else:
                aligned = Aligned(now_s=now(), req=note.req, step=note.step, tokens=note.tokens)
                self._step(Machine.LEARNER, aligned)
        if event is not None:
            self._step(Machine.LEARNER, event)
        self._replan()

    def _later(self, effect: Callable[[], None]) -> None:
        """Carry out ``effect`` now, or when the feed computing it commits (see :meth:`_feed`)."""
        if self._effects is None:
            effect()
        else:
            self._effects.append(effect)

    def _hand_over(self, handover: Callable[[], None]) -> None:
        """Give the pacer work, a pace or a plan now, or as the feed computing it commits."""
        if self._effects is None:
            handover()
        else:
            self._handovers.append(handover)

    def _collided(self) -> None:
        """A feed being computed aside cannot go on that way (a restart, a failure)."""
        if self._effects is not None:
            raise _CollidedError

    def _publish_note(self, note: CaptureNote) -> None:
        self._spawn(Machine.LEARNER, note.req, self._publish(note.req, note.taken))

    def _feed_step(self, note: StepNote) -> None:
        """A planned step: ``Stepped`` (unless the core stalled it already), then the
        commits folded in first, then the copies."""
        captures: list[Capture] = []
        epoch = self._epochs[Machine.LEARNER]
        if not note.plan.resumes:
            stepped = Stepped(now_s=now(), step=note.step, tokens=note.tokens)
            captures = self._step(Machine.LEARNER, stepped, made=True)
        for req in note.plan.applied:
            aligned = Aligned(now_s=now(), req=req, step=note.step, tokens=note.tokens)
            captures += self._step(Machine.LEARNER, aligned, made=True)
        if self.failure is None and self._epochs[Machine.LEARNER] == epoch:
            self._publish_taken(note, captures)

    def _step(self, machine: Machine, event: Event, *, made: bool = False) -> list[Capture]:
        """One transition. Its captures go to the training thread, unless ``made`` says
        that thread made them already at a planned step: then they are returned."""
        if self.failure is not None:
            return []
        if machine is Machine.CLOSER:
            self._step_closer(event)
            return []
        captures: list[Capture] = []
        pace: Pace | None = None
        try:
            for cmd in self._advance(machine, event):
                if isinstance(cmd, Pace):
                    pace = cmd
                elif isinstance(cmd, Capture):
                    captures.append(cmd)
                else:
                    if isinstance(cmd, Align):
                        self._count_learners(cmd.round)
                    self._later(functools.partial(self._interpret, machine, cmd))
        except Exception as error:
            self._collided()
            self._restart_learner(error)
            return []
        work: list[Work] = []
        if not made:
            work = [CaptureWork(req=c.req, round=c.round, fragment=c.fragment) for c in captures]
        if self.pacer is not None and (work or pace is not None):
            self._queued = [*self._queued, *work]
            self._hand_over(functools.partial(self.pacer.publish, work, pace))
        self._later(self._note_closed)
        return captures if made else []

    def _step_closer(self, event: Event) -> None:
        """One closer transition, isolated: whatever it raises restarts the closer alone.
        What it shares with the learner is told after its other commands (as the model
        cluster does), outside that isolation: the learner's feed is its own."""
        shares: list[Share] = []
        try:
            for cmd in self._advance(Machine.CLOSER, event):
                if isinstance(cmd, Share):
                    shares.append(cmd)
                else:
                    self._interpret(Machine.CLOSER, cmd)
        except Exception as error:
            self._restart_closer(error)
            return
        for share in shares:
            self._tell(Machine.LEARNER, share)

    def _tell(self, machine: Machine, share: Share) -> None:
        """Feed ``share`` to ``machine`` if this node runs it (:class:`Share`): the other
        machine's write, learned in the same turn of the loop, without a look at the store."""
        if (self.learner if machine is Machine.LEARNER else self.closer) is None:
            return
        self._feed(machine, Shared(now_s=now(), key=share.key, data=share.data))

    def _restart_closer(self, error: Exception) -> None:
        """Drop the closer's state and its requests in flight; a fresh one starts later."""
        assert self.closer is not None
        round_ = self.closer.round
        self.closer = closer.initial(
            self.node, self.manifest, self._digest, self._closer_options, self._run_auth
        )
        self._restart(Machine.CLOSER, error, round_)

    def _restart_learner(self, error: Exception) -> None:
        """Drop the learner's state, its requests in flight and the work and plan handed to
        the training thread, which stalls until a fresh learner has joined from the tape."""
        assert self.learner is not None
        round_ = self.learner.aligned_round
        self._fresh_learner()
        self._restart(Machine.LEARNER, error, round_)

    def _fresh_learner(self) -> None:
        """A fresh learner machine in place of the one there, and a pacer waiting for it.

        The fresh machine numbers its requests on from the old one's, so an outcome the
        training thread still reports for the old one is one it never asked for, and ignores.
        """
        assert self.learner is not None
        fresh = learner.initial(
            self.node, self.manifest, self._digest, self._learner_options, self._run_auth
        )
        self.learner = attrs.evolve(fresh, next_req=self.learner.next_req)
        self._planned, self._planned_applies = None, ()
        if self.pacer is not None:
            self.pacer.restart()

    def rejoin_learner(self) -> None:
        """Start a fresh learner after this node's closed one, at once: an ``either`` node
        the run no longer elects closer trains again (``events.Relieved``). It joins from the
        newest commit as after a restart (:meth:`_restart_learner`); training stalls until it
        has. The old learner's requests still in flight are void."""

        def rejoin() -> None:
            self._fresh_learner()
            self._epochs[Machine.LEARNER] += 1
            self._closing.discard(Machine.LEARNER)
            self.learner_closed.clear()
            self._feed(Machine.LEARNER, Started(now_s=now()))

        self._loop.call(rejoin)

    def _restart(self, machine: Machine, error: Exception, round_: int) -> None:
        """Report ``error``, void the machine's requests in flight, and start it again from
        the tape after the backoff."""
        self._epochs[machine] += 1
        self.restarts[machine] += 1
        times = self.restarts[machine]
        delay_s = min(RESTART_FIRST_S * 2.0 ** (times - 1), RESTART_LONGEST_S)
        LOG.error("gm %s of %s raised", machine.value, self.node, exc_info=error)
        self._hub.emit(
            events.MachineRestarted(
                node=self.node,
                round=round_,
                detail=f"{machine}: {_describe(error)}; restarts from the tape in {delay_s:g} s",
                at_s=now(),
                machine=machine.value,
                times=times,
            )
        )
        self._wake(machine, now() + delay_s, restart=True)

    def _replan(self) -> None:
        """Remake the pacer's plan if the learner or the commits queued for it changed
        (loop thread, with the queue the feed saw: see :meth:`_feed`)."""
        assert self.pacer is not None
        applies = queued_applies(self._queued)
        if self.learner is self._planned and applies == self._planned_applies:
            return
        self._planned, self._planned_applies = self.learner, applies
        plan = self._forecast(applies)
        prepared: tuple[Prepared, ...] = ()
        if plan is not None and self._replica is not None:
            # outside the pacer's lock; the commits the plan folds in are all queued
            releasing = [w.round for w in self._queued if isinstance(w, ApplyWork)]
            prepared = self._replica.prepare(
                plan.captures,
                releasing if plan.applied else (),
                self.pacer.prepared_captures(),
            )
        self._hand_over(functools.partial(self.pacer.plan, plan, prepared))

    def _forecast(self, applies: tuple[int, ...]) -> Plan | None:
        """What the learner will answer to the step its pace waits for, asked of the core.

        ``advance`` is pure, so feeding it a ``Stepped`` that has not happened costs
        nothing but the time; only the captures and the pace it answers with are kept
        (neither depends on the clock or the tokens). Where the core would stall that
        step until a commit is folded in, and the training thread already holds every
        commit queued (``applies``), the plan folds them in first and asks the core what
        it then says — the order the slow path takes (report, stall, fold in, capture),
        minus the waits. None where training will stall there anyway or the runtime has
        failed: the training thread then asks at that step. None too while a failed
        capture waits to be retried: when it is retried depends on the clock (a retry
        falling due between the plan and its step would add a capture the plan lacks).
        """
        state = self.learner
        pace = state.pace if state is not None else None
        if state is None or pace is None or self.failure is not None or state.retries:
            return None
        if pace.stalled:
            return self._forecast_resume(state, applies)
        step, tokens, at_s = pace.next_step, state.tokens, now()
        applied: tuple[int, ...] = ()
        try:
            after, cmds = learner.advance(state, Stepped(now_s=at_s, step=step, tokens=tokens))
            captures = [c for c in cmds if isinstance(c, Capture)]
            if after.pace is not None and after.pace.stalled and applies and not captures:
                for req in applies:
                    aligned = Aligned(now_s=at_s, req=req, step=step, tokens=tokens)
                    after, cmds = learner.advance(after, aligned)
                    captures += [c for c in cmds if isinstance(c, Capture)]
                applied = applies
        except Exception:
            return None  # the real step will raise it where it belongs
        if after.pace is None or after.pace.stalled:
            return None
        return Plan(
            step=step,
            captures=tuple((c.round, c.fragment) for c in captures),
            next_step=after.pace.next_step,
            applied=applied,
        )

    def _forecast_resume(
        self, state: learner.LearnerState, applies: tuple[int, ...]
    ) -> Plan | None:
        """What the learner, stalled at the step it heard last, will answer once the
        commits queued (``applies``) are folded in at that step, if it then lets training
        go on: the training thread waiting there carries it out without a round trip."""
        if not applies:
            return None
        after, captures, at_s = state, [], now()
        try:
            for req in applies:
                aligned = Aligned(now_s=at_s, req=req, step=state.step, tokens=state.tokens)
                after, cmds = learner.advance(after, aligned)
                captures += [c for c in cmds if isinstance(c, Capture)]
        except Exception:
            return None  # the real feed will raise it where it belongs
        if after.pace is None or after.pace.stalled:
            return None
        return Plan(
            step=state.step,
            captures=tuple((c.round, c.fragment) for c in captures),
            next_step=after.pace.next_step,
            applied=applies,
            resumes=True,
        )

    def _publish_taken(self, note: StepNote, captures: list[Capture]) -> None:
        """Publish the copies made at a planned step, once the core has asked for them."""
        asked = tuple((c.round, c.fragment) for c in captures)
        pace = self.learner.pace if self.learner is not None else None
        if asked != note.plan.captures or pace is None or pace.next_step != note.plan.next_step:
            self._collided()
            self._fail(
                AssertionError(
                    f"step {note.step}: the core asked for captures {asked} and {pace}, "
                    f"not the {note.plan} the training thread carried out"
                )
            )
            return
        for cmd, taken in zip(captures, note.taken, strict=True):
            self._later(functools.partial(self._publish_note, CaptureNote(cmd.req, taken)))

    def _advance(self, machine: Machine, event: Event) -> list[Command]:
        if machine is Machine.LEARNER:
            assert self.learner is not None
            self.learner, cmds = learner.advance(self.learner, event)
        else:
            assert self.closer is not None
            self.closer, cmds = closer.advance(self.closer, event)
        return cmds

    def _note_closed(self) -> None:
        if self.learner is None or self.learner_closed.is_set():
            return
        if self.learner.phase is learner.Phase.CLOSED:
            self.learner_closed.set()
            if self.pacer is not None:
                self.pacer.wake()

    def _fail(self, error: BaseException) -> None:
        LOG.error("gm runtime of %s stopped: %s", self.node, _describe(error), exc_info=error)
        self.failure = error
        if self.pacer is not None:
            self.pacer.fail(error)

    def _interpret(self, machine: Machine, cmd: Command) -> None:
        if isinstance(cmd, WakeAt):
            self._wake(machine, cmd.at_s)
        elif isinstance(cmd, Share):  # a learner's, carried out once its feed commits
            other = Machine.CLOSER if machine is Machine.LEARNER else Machine.LEARNER
            self._tell(other, cmd)
        elif isinstance(cmd, Notify):
            event = events.from_notify(cmd, self.node, now())
            if isinstance(event, events.Diverged):
                self.divergences = event.times
            self._hub.emit(event)
        elif isinstance(cmd, Verify):
            self._spawn(machine, cmd.req, self._verify(cmd))
        elif isinstance(cmd, Merge):
            self._spawn(machine, cmd.req, self._merge(cmd))
        elif isinstance(cmd, Align):
            self._spawn(machine, cmd.req, self._align(cmd))
        elif isinstance(cmd, Fetch):
            self._spawn(machine, -1, self._fetch(cmd))
        elif isinstance(cmd, Get | Probe | PutOnce | PutOver | List | Delete | DeletePrefix):
            self._spawn(machine, cmd.req, self._store(cmd))
        else:
            raise TypeError(f"no interpretation for {cmd!r}")

    def _count_learners(self, round_: int) -> None:
        record = self.learner.fetched.get(round_) if self.learner is not None else None
        if record is not None:
            self.members = batch.membership(record)

    def _spawn(self, machine: Machine, req: int, work: Coroutine[Any, Any, Event | None]) -> None:
        """Carry out ``work``; feed its outcome, or ``RequestFailed`` if it raised."""

        epoch = self._epochs[machine]

        async def outcome() -> None:
            try:
                event = await work
            except UnusablePayloadError as error:
                event = Unusable(
                    now_s=now(), req=req, key=error.key, reason=error.reason, detail=error.detail
                )
            except Exception as error:
                event = RequestFailed(now_s=now(), req=req, error=_describe(error))
            if event is not None and self._epochs[machine] == epoch:
                self._feed(machine, event)

        task = asyncio.get_running_loop().create_task(outcome())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self, machine: Machine, at_s: float, *, restart: bool = False) -> None:
        """Replace the machine's one timer; ``restart`` starts the machine when it fires."""
        old = self._timers.pop(machine, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[machine] = loop.call_at(at_s, self._fire, machine, at_s, restart)

    def _fire(self, machine: Machine, at_s: float, restart: bool) -> None:
        self._timers.pop(machine, None)
        # asyncio may run a timer a clock tick early; the machine must see its deadline passed.
        at_s = max(now(), at_s)
        if restart and machine in self._closing:
            return
        self._feed(machine, Started(now_s=at_s) if restart else TimerFired(now_s=at_s))

    async def _compute(self, fn: Callable[..., T], *args: Any) -> T:
        """CPU work (codecs, hashing, merges) on a worker thread, never on the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    # -- store commands ----------------------------------------------------------------------------

    async def _store(self, cmd: Command) -> Event:
        mailbox = self._mailbox
        if isinstance(cmd, Get):
            got = await self._reads.json(cmd.key)
            if got is None:
                return GotObject(now_s=now(), req=cmd.req, data=None, etag=None)
            return GotObject(
                now_s=now(), req=cmd.req, data=got.data, etag=got.etag, refused=got.refused
            )
        if isinstance(cmd, Probe):
            return Probed(now_s=now(), req=cmd.req, etag=await mailbox.probe(cmd.key))
        if isinstance(cmd, PutOnce):
            outcome = await mailbox.put_once(cmd.key, cmd.data)
            return PutDone(now_s=now(), req=cmd.req, created=outcome is PutOutcome.CREATED)
        if isinstance(cmd, PutOver):
            await mailbox.put(cmd.key, cmd.data)
            return PutDone(now_s=now(), req=cmd.req, created=True)
        if isinstance(cmd, List):
            items, cut = await self._reads.list(cmd.prefix, offset=cmd.offset)
            return Listed(now_s=now(), req=cmd.req, keys=tuple(x.key for x in items), cut=cut)
        if isinstance(cmd, Delete):
            await mailbox.delete(cmd.keys)
            return Deleted(now_s=now(), req=cmd.req)
        assert isinstance(cmd, DeletePrefix)
        await mailbox.delete_prefix(cmd.prefix)
        return Deleted(now_s=now(), req=cmd.req)

    # -- payload commands --------------------------------------------------------------------------

    async def _payload(
        self,
        cache: FragmentCache[PayloadRef, Any],
        fragment: int,
        role: Role,
        ref: PayloadRef,
        backend: Backend[Any] | None = None,
    ) -> Any:
        """A payload's fragment, decoded and judged, cached by its whole reference (see
        :mod:`gm_shell.cache`): a host array, or with ``backend`` one of its buffers."""
        cached = cache.get(ref)
        if cached is not None:
            return cached
        key = (id(cache), ref)
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.ensure_future(self._reads.payload(fragment, role, ref, backend))
            self._reading[key] = reading
            reading.add_done_callback(functools.partial(self._read_ended, key))
        value = await asyncio.shield(reading)  # one asker's cancellation is not the others'
        cache.put(ref, value, _at(fragment, ref))
        return value

    def _read_ended(self, key: tuple[int, PayloadRef], reading: asyncio.Future[Any]) -> None:
        """A shared payload read ended: forget it (its outcome was the askers' to take)."""
        del self._reading[key]
        if not reading.cancelled():
            reading.exception()  # taken here too: every asker may have been cancelled

    async def commit(self, fragment: int, ref: PayloadRef) -> F32:
        """A committed theta (from this node's own writes or reads when cached)."""
        theta: F32 = await self._payload(self._commits, fragment, Role.THETA, ref)
        return theta

    async def _publish(self, req: int, taken: Taken) -> Event:
        preload = self._may_preload()
        self._preloading += preload
        try:
            if self._replica is not None and not self._replica.verify(taken):
                self._replica.recycle(taken)
                raise RuntimeError(
                    f"a parameter of fragment {taken.fragment} moved to other memory around "
                    f"the step of round {taken.round}'s capture; it is captured afresh"
                )
            data, ref, judged = await self._compute(self._encode_delta, taken, preload)
            await self._mailbox.put_once(ref.key, data)  # taken: the same bytes are there
        except Exception:
            if self.pacer is not None:
                self.pacer.publish([ForgetWork(round=taken.round)], None)
            raise
        finally:
            self._preloading -= preload  # counted among the preloaded below, no await between
        if judged is not None:
            self._deltas.put(ref, judged)
            self._preloaded.append(ref)
        return Captured(now_s=now(), req=req, payload=ref, requests=self._requests())

    def _may_preload(self) -> bool:
        """Whether a capture's delta is decoded for this node's closer as it is encoded.

        At most ``in_flight`` such deltas wait unmerged: a new one makes room by dropping
        the oldest. In a run that goes as planned that one is merged already (a learner
        publishes a round only once the round ``in_flight`` before it is committed); one
        this node's closer never merges (a round another closer decided, a snapshot left
        out) would otherwise stay for good. At close a learner publishes every fragment's
        final delta at once: held decoded, they were the whole model beside the closer's
        momentum; those dropped before their merge are read again then."""
        if self._closer_options is None:  # no closer on this node (set once, any thread)
            return False
        room = self.manifest.config.in_flight - self._preloading
        if room <= 0:
            return False
        self._preloaded = [ref for ref in self._preloaded if ref in self._deltas]
        while len(self._preloaded) >= room:
            self._deltas.discard(self._preloaded.pop(0))
        return True

    def _encode_delta(self, taken: Taken, preload: bool) -> tuple[Sealed, PayloadRef, Any]:
        """A worker's part of a capture: the delta, its bytes, and the buffer given back.

        With ``preload`` (a node that also closes, :meth:`_may_preload`), the payload is
        judged here as its closer's ``Verify`` would judge it, and what a read of it would
        give goes to the closer's cache (:meth:`FragmentCodec.judged`: the delta itself
        where the wire is exact, not a decode of its bytes beside it): its own learner's
        snapshot then costs the closer no GET and no trip to a worker (a round's critical
        path, bench_step); a delta that is not finite is left for ``Verify`` to judge.

        The delta is made in the payload as it is encoded, never whole beside it, where θ
        stays for carry and no closer here keeps it, or where the payload is a bare file
        (its bytes are the values: what the closer keeps is a view of them)."""
        fragment, round_ = taken.fragment, taken.round
        delta = None
        try:
            if self._codec.bare(Role.DELTA) or (taken.kept and not preload):
                data, ref = self._codec.encode(
                    fragment, Role.DELTA, round_, taken.anchor, minus=taken.theta
                )
            else:
                delta = taken.delta(fresh=preload)
                data, ref = self._codec.encode(fragment, Role.DELTA, round_, delta)
        finally:
            if self._replica is not None:
                self._replica.recycle(taken)
        if not preload:
            return data, ref, None
        try:
            judged = self._codec.judged(fragment, Role.DELTA, ref, delta, data, self._codec.device)
        except UnusablePayloadError:
            judged = None
        return data, ref, judged

    async def _fetch(self, cmd: Fetch) -> None:
        """Read a commit into the cache ahead of its load; a failure is the load's to meet."""
        try:
            await self.commit(cmd.fragment, cmd.theta)
        except Exception as error:
            LOG.debug("%s: read ahead of %s failed: %s", self.node, cmd.theta.key, error)

    async def _align(self, cmd: Align) -> None:
        committed = await self.commit(cmd.fragment, cmd.theta)
        assert self.pacer is not None
        work = ApplyWork(
            req=cmd.req,
            round=cmd.round,
            fragment=cmd.fragment,
            committed=committed,
            mode=cmd.mode,
            mixing=cmd.mixing,
        )
        # Carry from the anchor when the commit left our snapshot out: forget its copy.
        forget = [] if cmd.from_snapshot else [ForgetWork(round=cmd.round)]
        self.pacer.publish([*forget, work], None)
        self._feed(Machine.LEARNER, None)  # a commit in hand may spare a stall: plan with it

    async def _verify(self, cmd: Verify) -> Event:
        fragment = schedule.fragment_of(cmd.round, self.manifest.config.fragments)
        try:
            await self._payload(self._deltas, fragment, Role.DELTA, cmd.payload, self._codec.device)
        except UnusablePayloadError as rejected:
            return Verified(now_s=now(), req=cmd.req, reason=rejected.reason)
        return Verified(now_s=now(), req=cmd.req, reason=None)

    async def _merge(self, cmd: Merge) -> Event:
        """Merge on the codec's device (an accelerator, else the host): deltas and momentum
        are decoded there (and cached there), theta and momentum encoded there; the new theta
        comes back to the host once, for the commit cache a learner aligns from."""
        fragment = cmd.fragment
        base = cmd.base
        device = self._codec.device
        theta = await self.commit(fragment, base.theta)
        momentum = None
        if base.momentum is not None:
            momentum = await self._payload(
                self._momenta, fragment, Role.MOMENTUM, base.momentum, device
            )
            if not cmd.final_only:  # the new momentum is made in its place: not a value to keep
                self._momenta.discard(base.momentum)
        deltas: list[Any] = [None] * len(cmd.contributions)

        async def read(i: int, ref: PayloadRef) -> None:
            # Into the list, not a task's result: a finished task would hold the delta
            # until the loop let go of it, after the merge had begun (see spare).
            deltas[i] = await self._payload(self._deltas, fragment, Role.DELTA, ref, device)

        await asyncio.gather(*(read(i, c.payload) for i, c in enumerate(cmd.contributions)))
        for c in cmd.contributions:  # held by ``deltas`` alone now: dropped once merged
            self._deltas.discard(c.payload)
        finals = tuple(c.final for c in cmd.contributions)
        contributions = Contributions(
            learners=tuple(c.learner for c in cmd.contributions),
            weights=normalized_weights([c.weight for c in cmd.contributions]),
            final=finals if any(finals) else (),
        )
        merged, written = await self._compute(
            self._merged, cmd, theta, momentum, deltas, contributions
        )
        theta_ref, outer = await self._store_merged(cmd, merged, written)
        return Merged(
            now_s=now(),
            req=cmd.req,
            theta=theta_ref,
            outer=outer,
            update=None,
            cosine=merged.cosine,
            outliers=merged.outliers,
            requests=self._requests(),
        )

    def _merged(
        self,
        cmd: Merge,
        theta: F32,
        momentum: Any,
        deltas: list[Any],
        contributions: Contributions,
    ) -> tuple[MergedArrays[Any], tuple[Sealed, PayloadRef, Any]]:
        """A worker's part of a merge, in one trip: the merge and outer step, then the new
        theta's payload, with what a reader of its bytes will decode (:meth:`_written`).
        One trip, not one per step: under load each trip to a worker and back waits for
        both threads to be scheduled (4-13 ms at the p90 per trip in bench_step's loop at
        load 14 on 2 cores, against a median of 0.2-0.8 ms). The deltas are dropped
        before the encode (``deltas`` is emptied: the cache let them go already), so a
        fragment's payloads are never encoded beside its decoded deltas: on a closer whose
        fragment is the model, that is the deltas' bytes less at its peak; a merge redone
        (an upload failed) reads them again. The new theta is made in a delta nothing else
        holds (:func:`spare`): a fragment's bytes less again."""
        fragment, round_ = cmd.fragment, cmd.round
        merged = self._codec.merge_held(
            fragment, theta, momentum, deltas, contributions,
            handed_over=not cmd.final_only, into=spare(deltas, self._reuses_uploads),
        )  # fmt: skip
        deltas.clear()  # their last reference (see _merge): gone before the encode
        written = self._written(fragment, Role.THETA, round_, merged.theta, home=True)
        return attrs.evolve(merged, theta=written[2]), written  # the buffer merged into goes

    async def _store_merged(
        self, cmd: Merge, merged: MergedArrays[Any], written: tuple[Sealed, PayloadRef, Any]
    ) -> tuple[PayloadRef, PayloadRef | None]:
        """Upload the new theta while a worker encodes the momentum (unless the round
        holds final deltas only: it keeps the momentum it had), then the momentum: the
        theta's bytes are let go once uploaded, so the two payloads are seldom held at
        once (one trip more to a worker, against the theta's upload)."""
        theta_up = asyncio.ensure_future(self._upload(self._commits, cmd.fragment, *written))
        del written
        outer = None
        try:
            if not cmd.final_only:
                # Kept as its payload's values where those bytes are ours again once
                # uploaded: the next merge makes the new momentum there, and it is then
                # its own payload (payload._bare_f32): no copy a round.
                encode = functools.partial(self._written, home=self._reuses_uploads)
                encoded = await self._compute(
                    encode, cmd.fragment, Role.MOMENTUM, cmd.round, merged.momentum
                )
                outer = await self._upload(self._momenta, cmd.fragment, *encoded)
        except BaseException:
            theta_up.cancel()  # the merge failed: no one awaits its theta's upload
            await asyncio.gather(theta_up, return_exceptions=True)
            raise
        return await theta_up, outer

    def _requests(self) -> Requests:
        """This node's requests so far, for the tape's running total (see records.Requests)."""
        stats = self._mailbox.stats
        return Requests(
            lists=stats.list_requests,
            gets=stats.get_requests,
            puts=stats.put_requests,
            deletes=stats.delete_requests,
        )

    def _written(
        self, fragment: int, role: Role, round_: int, x: Any, *, home: bool = False
    ) -> tuple[Sealed, PayloadRef, Any]:
        """Encode ``x`` (a buffer on the codec's device) there; with it, what any reader of
        those bytes will decode: on the device, or with ``home`` on the host (decoded from
        the bytes there, or ``x`` copied back once when they are exact). A worker's part."""
        device = self._codec.device
        data, ref = self._codec.encode(fragment, role, round_, x, device)
        back = self._codec.brought_home if home else self._codec.roundtrip
        return data, ref, back(fragment, role, x, data, device)

    async def _upload(
        self,
        cache: FragmentCache[PayloadRef, Any],
        fragment: int,
        data: Sealed,
        ref: PayloadRef,
        decoded: Any,
    ) -> PayloadRef:
        """Upload a payload create-once; then cache what a reader of it decodes."""
        await self._mailbox.put_once(ref.key, data)
        cache.put(ref, decoded, _at(fragment, ref))
        return ref


def spare(buffers: list[Any], uploads: bool = False) -> int | None:
    """The index of a buffer in ``buffers`` that nothing else refers to (the list's is its
    only reference) and whose memory is its own (:func:`_owned`), free to be overwritten;
    None if there is none. A merge's deltas are let go by the closer's cache before it,
    but one read by two askers at once, or one viewed in the bytes of a payload a store
    may hold, is not the merge's to write: the count of references and the owner say so,
    whatever path the buffer came by. With ``uploads`` (the bytes of a payload this node
    uploaded are its own again), a learner's own delta viewed in its payload is spare
    too, where nothing else holds those bytes: the new theta is then made in the payload,
    which becomes the new theta's payload as it is (``payload._bare_f32``)."""
    for i in range(len(buffers)):
        if sys.getrefcount(buffers[i]) <= _LISTED_ALONE and _owned(buffers[i], uploads):
            return i
    return None


def _listed_alone() -> int:
    """What ``sys.getrefcount`` says of an object a list alone refers to, read the way
    :func:`spare` reads it (on CPython 3.11: 2, the list's and the call's; interpreters
    that count references on the stack differently say so here, not in a constant)."""
    listed = [object()]
    return sys.getrefcount(listed[0])


_LISTED_ALONE = _listed_alone()


def _owned(x: Any, uploads: bool = False) -> bool:
    """A buffer's memory is its own: a numpy array's, writable (not a view of a payload's
    bytes, which a store may hold, but with ``uploads`` the values of a bare payload: a
    learner's own delta, whose bytes only its view holds once uploaded); a torch tensor's,
    of torch's making (not numpy's). A spilled delta is a file: never written."""
    if isinstance(x, Spilled):
        return False
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            return False
        return x.base is None or (uploads and bare_file_of(x) is not None)
    storage = getattr(x, "untyped_storage", None)
    return storage is None or (x._base is None and bool(storage().resizable()))


def _at(fragment: int, ref: PayloadRef) -> tuple[int, int] | None:
    """A payload's fragment and the round it was written for (its key names it), for the
    caches that keep each fragment's newest."""
    try:
        parsed = keys.parse(ref.key)
    except (keys.BadKey, TypeError):
        return None
    return (fragment, parsed.round) if isinstance(parsed, keys.PayloadKey) else None
