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
- ``Capture`` goes to the training thread (:mod:`gm_shell.pacer`), which copies
  the fragment's delta at this very step and hands it back; encoding, hashing
  and the create-once upload then run off the loop;
- ``Verify`` fetches a snapshot's payload and judges it
  (:class:`~gm_shell.fragments.FragmentCodec`), keeping the decoded delta for
  the merge; ``Merge`` runs the merge and Nesterov step in a worker thread and
  writes the new theta (and momentum) create-once;
- ``Align`` fetches and decodes a commit off the loop, then hands it to the
  training thread, which folds it into the model at its next step and reports
  ``Aligned`` with that step;
- ``WakeAt`` replaces the machine's one timer; ``Pace`` goes to the pacer;
  ``Notify`` becomes a typed event (:mod:`gm_shell.events`).

Any exception in carrying out a command becomes ``RequestFailed``; the core
decides what to do about it. An exception from ``advance`` itself is a bug or a
misuse: the runtime stops feeding and the training thread raises it.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gm_core import closer, learner, plan, schedule
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Get,
    List,
    Merge,
    Notify,
    Pace,
    Probe,
    PutOnce,
    PutOver,
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
    Listed,
    Merged,
    Probed,
    PutDone,
    RequestFailed,
    Started,
    Stepped,
    TimerFired,
    Verified,
)
from gm_core.numerics import Contributions
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment, Manifest, PayloadRef, Requests
from gm_core.verdicts import normalized_weights
from gm_shell import events
from gm_shell.cache import FragmentCache
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox, PutOutcome
from gm_shell.pacer import ApplyWork, CaptureWork, ForgetWork, Pacer, Work
from gm_shell.replica import Replica

LOG = logging.getLogger("gm")
T = TypeVar("T")


class Machine(enum.StrEnum):
    LEARNER = "learner"
    CLOSER = "closer"


def now() -> float:
    """This node's clock: monotonic, the same one the loop's timers use."""
    return time.monotonic()


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


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
        cache_bytes: int,
    ) -> None:
        digest = plan.schema_digest(manifest.schema)
        self.node = node
        self.manifest = manifest
        self.learner = (
            learner.initial(node, manifest, digest, learner_options)
            if replica is not None and learner_options is not None
            else None
        )
        self.closer = (
            closer.initial(node, manifest, digest, closer_options) if closer_options else None
        )
        self.pacer = (
            Pacer(replica, self, keep_copies=manifest.config.alignment is Alignment.CARRY)
            if replica is not None and self.learner is not None
            else None
        )
        self.learner_closed = threading.Event()
        self.failure: BaseException | None = None
        self.learners_seen = 1
        """Learners of the newest round this learner aligned with, itself included."""
        self._mailbox = mailbox
        self._codec = codec
        self._hub = hub
        self._loop = loop
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"gm-compute-{node}")
        self._timers: dict[Machine, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._deltas = FragmentCache(cache_bytes)
        self._commits = FragmentCache(cache_bytes)
        self._momenta = FragmentCache(cache_bytes)

    # -- lifecycle (called from other threads) --------------------------------------------------

    def start(self) -> None:
        self._loop.call(self._start)

    def _start(self) -> None:
        for machine in self._machines():
            self._feed(machine, Started(now_s=now()))

    def _machines(self) -> list[Machine]:
        present = [(Machine.LEARNER, self.learner), (Machine.CLOSER, self.closer)]
        return [machine for machine, state in present if state is not None]

    def request_close(self, machine: Machine) -> None:
        self._loop.call(lambda: self._feed(machine, CloseRequested(now_s=now())))

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

    # -- the pacer's link (called from the training thread) -------------------------------------

    def report(self, step: int, tokens: int) -> None:
        self._loop.call(
            lambda: self._feed(Machine.LEARNER, Stepped(now_s=now(), step=step, tokens=tokens))
        )

    def captured(self, work: CaptureWork, delta: F32) -> None:
        self._loop.post(lambda: self._spawn(Machine.LEARNER, work.req, self._publish(work, delta)))

    def applied(self, work: ApplyWork, step: int, tokens: int) -> None:
        event = Aligned(now_s=now(), req=work.req, step=step, tokens=tokens)
        self._loop.post(lambda: self._feed(Machine.LEARNER, event))

    # -- feeding the machines (loop thread only) ------------------------------------------------

    def _feed(self, machine: Machine, event: Event) -> None:
        if self.failure is not None:
            return
        try:
            cmds = self._advance(machine, event)
        except Exception as error:
            self._fail(error)
            return
        work: list[Work] = []
        pace: Pace | None = None
        for cmd in cmds:
            if isinstance(cmd, Pace):
                pace = cmd
            elif isinstance(cmd, Capture):
                work.append(CaptureWork(req=cmd.req, round=cmd.round, fragment=cmd.fragment))
            else:
                self._interpret(machine, cmd)
        if self.pacer is not None and (work or pace is not None):
            self.pacer.publish(work, pace)
        self._note_closed()

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
        elif isinstance(cmd, Notify):
            self._hub.emit(events.from_notify(cmd, self.node, now()))
        elif isinstance(cmd, Verify):
            self._spawn(machine, cmd.req, self._verify(cmd))
        elif isinstance(cmd, Merge):
            self._spawn(machine, cmd.req, self._merge(cmd))
        elif isinstance(cmd, Align):
            self._count_learners(cmd.round)
            self._spawn(machine, cmd.req, self._align(cmd))
        elif isinstance(cmd, Get | Probe | PutOnce | PutOver | List | Delete | DeletePrefix):
            self._spawn(machine, cmd.req, self._store(cmd))
        else:
            raise TypeError(f"no interpretation for {cmd!r}")

    def _count_learners(self, round_: int) -> None:
        record = self.learner.fetched.get(round_) if self.learner is not None else None
        if record is not None:
            self.learners_seen = len({p.learner for p in record.participants} | {self.node})

    def _spawn(self, machine: Machine, req: int, work: Coroutine[Any, Any, Event | None]) -> None:
        """Carry out ``work``; feed its outcome, or ``RequestFailed`` if it raised."""

        async def outcome() -> None:
            try:
                event = await work
            except Exception as error:
                event = RequestFailed(now_s=now(), req=req, error=_describe(error))
            if event is not None:
                self._feed(machine, event)

        task = asyncio.get_running_loop().create_task(outcome())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self, machine: Machine, at_s: float) -> None:
        old = self._timers.pop(machine, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[machine] = loop.call_at(at_s, self._fire, machine, at_s)

    def _fire(self, machine: Machine, at_s: float) -> None:
        self._timers.pop(machine, None)
        # asyncio may run a timer a clock tick early; the machine must see its deadline passed.
        self._feed(machine, TimerFired(now_s=max(now(), at_s)))

    async def _compute(self, fn: Callable[..., T], *args: Any) -> T:
        """CPU work (codecs, hashing, merges) on a worker thread, never on the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    # -- store commands ----------------------------------------------------------------------------

    async def _store(self, cmd: Command) -> Event:
        mailbox = self._mailbox
        if isinstance(cmd, Get):
            got = await mailbox.get(cmd.key)
            data, etag = (None, None) if got is None else (got.data, got.etag)
            return GotObject(now_s=now(), req=cmd.req, data=data, etag=etag)
        if isinstance(cmd, Probe):
            return Probed(now_s=now(), req=cmd.req, etag=await mailbox.probe(cmd.key))
        if isinstance(cmd, PutOnce):
            outcome = await mailbox.put_once(cmd.key, cmd.data)
            return PutDone(now_s=now(), req=cmd.req, created=outcome is PutOutcome.CREATED)
        if isinstance(cmd, PutOver):
            await mailbox.put(cmd.key, cmd.data)
            return PutDone(now_s=now(), req=cmd.req, created=True)
        if isinstance(cmd, List):
            items = await mailbox.list(cmd.prefix, offset=cmd.offset)
            return Listed(now_s=now(), req=cmd.req, keys=tuple(item.key for item in items))
        if isinstance(cmd, Delete):
            await mailbox.delete(cmd.keys)
            return Deleted(now_s=now(), req=cmd.req)
        assert isinstance(cmd, DeletePrefix)
        await mailbox.delete_prefix(cmd.prefix)
        return Deleted(now_s=now(), req=cmd.req)

    # -- payload commands --------------------------------------------------------------------------

    async def _payload(
        self, cache: FragmentCache, fragment: int, role: Role, ref: PayloadRef
    ) -> F32:
        """A payload's fragment, decoded and judged (cached by key: keys name their content)."""
        cached = cache.get(ref.key)
        if cached is not None:
            return cached
        got = await self._mailbox.get(ref.key)
        value = await self._compute(
            self._codec.load, fragment, role, ref, None if got is None else got.data
        )
        cache.put(ref.key, value)
        return value

    async def commit(self, fragment: int, ref: PayloadRef) -> F32:
        """A committed theta (from this node's own writes or reads when cached)."""
        return await self._payload(self._commits, fragment, Role.THETA, ref)

    async def _publish(self, work: CaptureWork, delta: F32) -> Event:
        try:
            data, ref = await self._compute(
                self._codec.encode, work.fragment, Role.DELTA, work.round, delta
            )
            await self._mailbox.put_once(ref.key, data)  # taken: the same bytes are there
        except Exception:
            if self.pacer is not None:
                self.pacer.publish([ForgetWork(round=work.round)], None)
            raise
        return Captured(now_s=now(), req=work.req, payload=ref, requests=self._requests())

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
        self.pacer.publish([work], None)

    async def _verify(self, cmd: Verify) -> Event:
        fragment = schedule.fragment_of(cmd.round, self.manifest.config.fragments)
        try:
            await self._payload(self._deltas, fragment, Role.DELTA, cmd.payload)
        except UnusablePayloadError as rejected:
            return Verified(now_s=now(), req=cmd.req, reason=rejected.reason)
        return Verified(now_s=now(), req=cmd.req, reason=None)

    async def _merge(self, cmd: Merge) -> Event:
        fragment = cmd.fragment
        base = cmd.base
        theta = await self.commit(fragment, base.theta)
        momentum = None
        if base.momentum is not None:
            momentum = await self._payload(self._momenta, fragment, Role.MOMENTUM, base.momentum)
        deltas = await asyncio.gather(
            *(
                self._payload(self._deltas, fragment, Role.DELTA, c.payload)
                for c in cmd.contributions
            )
        )
        finals = tuple(c.final for c in cmd.contributions)
        contributions = Contributions(
            learners=tuple(c.learner for c in cmd.contributions),
            weights=normalized_weights([c.weight for c in cmd.contributions]),
            final=finals if any(finals) else (),
        )
        new_theta, new_momentum, cosine = await self._compute(
            self._codec.merge, fragment, theta, momentum, deltas, contributions
        )
        writes = [self._write(self._commits, fragment, Role.THETA, cmd.round, new_theta)]
        if not cmd.final_only:  # a round of final deltas only keeps the momentum it had
            writes.append(
                self._write(self._momenta, fragment, Role.MOMENTUM, cmd.round, new_momentum)
            )
        refs = await asyncio.gather(*writes)
        outer = refs[1] if len(refs) > 1 else None
        return Merged(
            now_s=now(),
            req=cmd.req,
            theta=refs[0],
            outer=outer,
            update=None,
            cosine=cosine,
            requests=self._requests(),
        )

    def _requests(self) -> Requests:
        """This node's requests so far, for the tape's running total (see records.Requests)."""
        stats = self._mailbox.stats
        return Requests(
            lists=stats.list_requests,
            gets=stats.get_requests,
            puts=stats.put_requests,
            deletes=stats.delete_requests,
        )

    async def _write(
        self, cache: FragmentCache, fragment: int, role: Role, round_: int, x: F32
    ) -> PayloadRef:
        """Encode, upload create-once, and cache what any reader of those bytes will decode."""
        data, ref = await self._compute(self._codec.encode, fragment, role, round_, x)
        await self._mailbox.put_once(ref.key, data)
        cache.put(ref.key, await self._compute(self._codec.roundtrip, fragment, role, x, data))
        return ref
