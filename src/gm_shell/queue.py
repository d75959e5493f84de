"""``SharedQueue``: units of data that the nodes of a run share, each trained to completion once.

Theory of operation
-------------------
::

    shards = {f"shard-{i:03d}": path for i, path in enumerate(paths)}
    data = SharedQueue(shards, load=lambda path: batches_of(path), prefetch=1)
    with Session(model, algorithm=..., mailbox=url, node=name) as s:
        s.run(train_one_batch, data)        # returns when every unit is done

Only unit ids cross the bucket; ``load`` turns a unit's local value into its batches.
Every decision is :mod:`gm_core.queue`'s (which unit to claim, when a dead holder's
unit is re-issued, when a unit was lost to a peer, when the queue is exhausted); this
module carries out its commands on the session's mailbox and loop, one request at a
time, deletions of collected claims in the background, ``WakeAt`` as a sleep on the
loop's monotonic clock (the only clock a consumer reads). A failed request becomes
``RequestFailed``, which the machine answers by trying again at its next poll.

A node waits in :meth:`Consumer.want` while the units left are held by live peers:
one of them may die, and then this node re-issues its unit after the lease timeout.
Its own lease stays renewed meanwhile (the session's loop renews it).

``prefetch`` is how many units a node claims beyond the one it trains (claimed ahead so
that a slow node holds as many as a fast one but finishes fewer); a prefetched unit is
checked again before it starts. Loading itself is lazy: ``load`` is called when the unit
starts.

**No request between units** (:meth:`Consumer.end`, what ``Session.run`` uses). Once a
unit starts, a background task on the loop writes the previous unit's done marker and
claims the next ones and checks the first (:class:`gm_core.queue.Ahead`): at once while
many units are untouched, just in time near the end of the data (twice the last claim's
duration before the unit is expected to end, judged from the last unit's duration; at once
when the trainer asks), where a slow node that claimed a whole unit early would keep it
from a fast node (:func:`gm_core.queue.ahead_wait_s` decides). When the trainer has
stepped a unit's last batch it says so with :meth:`Consumer.end` and asks for the next,
which starts at once when it was checked. The trainer waits only when nothing was checked
ahead (the first unit, ``prefetch=0``, or nothing was free), and then first writes the
ended unit's marker, so that it never waits for peers while its own unit is unmarked. With
store latency ``L`` the background needs about five ``L`` per unit (the marker's check and
write, a listing, a claim, the next unit's check; near the end also reads of bodies peers
wrote): units shorter than that still wait for part of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from gm_core import queue as core
from gm_core import ranks
from gm_core.auth import HEADER_MAX_BYTES, Envelope
from gm_core.commands import Command, Delete, Get, List, Notify, Probe, PutOnce, WakeAt
from gm_core.events import (
    Event,
    GotObject,
    Listed,
    Probed,
    PutDone,
    RequestFailed,
    Started,
    TimerFired,
)
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox, PutOutcome, TooLargeError

LOG = logging.getLogger("gm")

__all__ = ["Consumer", "QueueMismatchError", "SharedQueue"]

V = TypeVar("V")


class QueueMismatchError(ValueError):
    """The bucket's queue holds another set of units than this node passed."""


class SharedQueue(Generic[V]):
    """Units of data shared by the nodes of a run (pass it to :meth:`gm_shell.Session.run`).

    Args:
        units: unit ids (``[A-Za-z0-9._-]``, 1-64 characters) mapped to this node's value
            for each (a path, a shard index...), or just the ids (then ``load`` gets the id).
            Every node passes the same ids; only the ids are written to the bucket.
        load: turns one unit's value into an iterable of batches.
        prefetch: units claimed ahead of the one being trained.
        name: the queue's id in the run (several queues may share a run).
    """

    def __init__(
        self,
        units: Mapping[str, V] | Iterable[str],
        load: Callable[[V], Iterable[Any]],
        *,
        prefetch: int = 1,
        name: str = "queue",
    ) -> None:
        values: dict[str, Any] = (
            dict(units) if isinstance(units, Mapping) else {u: u for u in units}
        )
        self.values = values
        self.load = load
        self.prefetch = prefetch
        self.name = name
        self.units = tuple(sorted(values))
        if len(self.units) != len(values) or not self.units:
            raise ValueError("a queue needs at least one unit, each id once")
        if name == ranks.QUEUE:
            raise ValueError(f"the queue name {name!r} is the run's ranks (Session(ranks=N))")

    def spec(
        self, *, node: str, lease_timeout_s: float, poll_s: float, envelope: Envelope
    ) -> core.QueueSpec:
        """The core's view of this queue for ``node`` (checks the ids and options)."""
        return core.QueueSpec(
            queue=self.name,
            node=node,
            units=self.units,
            prefetch=self.prefetch,
            lease_timeout_s=lease_timeout_s,
            poll_s=poll_s,
            envelope=envelope,
        )


class Consumer:
    """One node's use of a queue: :meth:`want` a unit, train it, :meth:`finish` it."""

    def __init__(self, mailbox: Mailbox, loop: LoopThread, spec: core.QueueSpec) -> None:
        self._mailbox = mailbox
        self._loop = loop
        self._background: set[asyncio.Task[None]] = set()
        self._seen_rejections = 0
        self._lock = asyncio.Lock()
        """One request at a time: the trainer's and a watcher's (both run on the loop)."""
        self._watcher: asyncio.Task[None] | None = None
        self._ending: core.Finish | None = None
        """A unit the trainer ended (:meth:`end`), handed over at the next :meth:`want` (or
        :meth:`give_back`, :meth:`close`), which takes it out of this slot at once: the
        trainer ends its next unit into the slot while the background writes this one."""
        self._behind: asyncio.Task[None] | None = None
        """The background work after a start: the ended unit's marker, then claims ahead."""
        self._wanted = asyncio.Event()
        """Set when the trainer wants the next unit (the claim ahead must not wait longer),
        or stops (then no claim ahead at all: :attr:`_stopping`)."""
        self._stopping = False
        self._started_s: float | None = None
        self._unit_s = 0.0
        """How long the last unit took, start to start (the trainer's pace)."""
        self._ahead_s = 0.0
        """How long the last claim ahead took (the store's pace)."""
        self._ahead_began = False
        """Whether the claim ahead after the last start has begun (for measurements)."""
        self.state = core.initial(spec)
        self._serve(Started(now_s=_now()))
        if self.state.outcome is core.Outcome.MISMATCHED:
            raise QueueMismatchError(self.state.mismatch)

    def want(self) -> core.Assignment | None:
        """The next unit to train (blocks while only live peers' units are left); None when
        every unit is done. After :meth:`end`, a unit checked ahead starts at once."""
        return self._loop.run(self._want())

    async def _want(self) -> core.Assignment | None:
        now_s = _now()
        if self._started_s is not None:
            self._unit_s = now_s - self._started_s
        await self._caught_up()
        ending = await self._ended()
        if ending is not None and not core.ready(self.state):
            await self._drive(ending)  # nothing checked ahead: may wait, so mark it first
            ending = None
        if self.state.phase is core.Phase.STOPPED:
            return None
        await self._drive(core.Want(now_s=_now()))  # with ``ending`` left: starts at once
        if self.state.outcome is not core.Outcome.ASSIGNED:
            return None
        self._started_s = _now()
        self._wanted = asyncio.Event()
        self._ahead_began = False
        wait_s = core.ahead_wait_s(self.state, self._unit_s, self._ahead_s)
        self._behind = asyncio.get_running_loop().create_task(self._ahead(ending, wait_s))
        return self.state.current

    async def _ahead(self, ending: core.Finish | None, wait_s: float) -> None:
        if ending is not None:
            await self._drive(ending)  # at once: the unit is done, peers may be waiting on it
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), wait_s)
        if self._stopping:
            return
        began = _now()
        self._ahead_began = True
        await self._drive(core.Ahead(now_s=began))
        self._ahead_s = _now() - began

    async def _ended(self) -> core.Finish | None:
        """Take the unit the trainer ended out of its slot and tell the machine (it is then
        no longer the one trained); its marker is the caller's to write."""
        ending, self._ending = self._ending, None
        current = self.state.current
        if ending is not None and current is not None and current.unit == ending.unit:
            await self._drive(core.Ended(now_s=_now(), unit=ending.unit))
        return ending

    async def _flush(self) -> None:
        """Write the done marker of the unit the trainer ended, if any."""
        ending = await self._ended()
        if ending is not None:
            await self._drive(ending)

    async def _caught_up(self) -> None:
        """Wait for the background work after the last start (raising what it raised: only
        a core bug raises there; a failed request is retried by the machine)."""
        behind, self._behind = self._behind, None
        self._wanted.set()
        if behind is not None:
            await behind

    def end(self, unit: str, steps: int, tokens: int) -> None:
        """The trainer stepped ``unit``'s last batch: its done marker is written in the
        background (after the next :meth:`want`), or by :meth:`give_back` or :meth:`close`."""
        self._ending = core.Finish(now_s=_now(), unit=unit, steps=steps, tokens=tokens)

    def finish(self, unit: str, steps: int, tokens: int) -> bool:
        """Write ``unit``'s done marker now; False when a peer took it over meanwhile."""
        self._serve(core.Finish(now_s=_now(), unit=unit, steps=steps, tokens=tokens))
        return self.state.outcome is core.Outcome.DONE

    def give_back(
        self, timeout_s: float | None = None, *, leaving: bool = False
    ) -> tuple[str, ...]:
        """Give back every unit claimed here and not started (this node stops training), and
        any claimed under this node's id before a restart: peers take them at once. The
        units given back (a claim a peer had already re-issued is not among them). An
        ended unit's done marker is written first. ``timeout_s`` bounds the wait;
        ``leaving``: the unit being trained, cut short by an error, goes back too."""
        return self._loop.run(self._give_back(leaving), timeout_s)

    def give_back_leaving(self, timeout_s: float) -> None:
        """This node leaves with an error: give back its units, the one cut short and those
        not started, if the store answers within ``timeout_s`` (else they are re-issued
        once its lease has aged out on a peer's clock, as a crashed node's are); a failure
        is logged, not raised."""
        if not self._loop.alive:
            return
        try:
            given = self.give_back(timeout_s, leaving=True)
        except Exception as error:
            LOG.warning(
                "queue %s: leaving: could not give units back: %s", self.state.spec.queue, error
            )
            return
        LOG.info(
            "queue %s: leaving: gave back %d unstarted units %s",
            self.state.spec.queue,
            len(given),
            given,
        )

    async def _give_back(self, leaving: bool = False) -> tuple[str, ...]:
        self._stopping = True  # a claim ahead not begun yet would only be given back
        await self._caught_up()
        await self._flush()
        before = len(self.state.given)
        if self.state.phase is not core.Phase.STOPPED:
            await self._drive(core.GiveBack(now_s=_now(), leaving=leaving))
        return self.state.given[before:]

    def watch(self, period_s: float, on_lost: Callable[[], None]) -> None:
        """Check every ``period_s`` (on the loop) that the unit being trained is still this
        node's; call ``on_lost`` on the loop once it is not, and stop watching."""

        async def watching() -> None:
            while True:
                await asyncio.sleep(period_s)
                await self._drive(core.Watch(now_s=_now()))
                if self.state.outcome is core.Outcome.LOST:
                    on_lost()
                    return

        def begin() -> None:
            self._watcher = asyncio.get_running_loop().create_task(watching())

        self._loop.call(begin)

    def unwatch(self) -> None:
        """Stop watching; a check cut short changes nothing (the state is a value, kept
        only once a request has settled)."""

        async def stop() -> None:
            watcher, self._watcher = self._watcher, None
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

        if self._watcher is not None and self._loop.alive:
            self._loop.run(stop())

    def _serve(self, event: core.QueueEvent) -> None:
        self._loop.run(self._drive(event))

    async def _drive(self, event: core.QueueEvent) -> None:
        async with self._lock:
            self.state = await drive(
                self._mailbox,
                core.advance,
                self.state,
                event,
                settled=lambda s: s.phase in (core.Phase.IDLE, core.Phase.STOPPED),
                spawn=self._spawn,
                seen=self._log,
            )

    def _log(self, state: core.QueueState) -> None:
        self._seen_rejections = log_rejections(
            f"queue {state.spec.queue}", state.rejections, state.rejected, self._seen_rejections
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        """Write an ended unit's done marker (it was trained to its end) and let the
        background work and deletions already sent land (bounded), so a closing session
        does not cut them. A failure here is logged: the unit is then resumed or re-issued."""

        async def settle() -> None:
            try:
                self._stopping = True
                await asyncio.wait_for(self._caught_up(), 60.0)
                await asyncio.wait_for(self._flush(), 60.0)
            except Exception as error:
                LOG.warning("queue %s: closing: %s", self.state.spec.queue, error)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.gather(*self._background, return_exceptions=True), 10.0
                )

        if self._loop.alive and (self._background or self._behind or self._ending):
            self._loop.run(settle())


def _now() -> float:
    return time.monotonic()


S = TypeVar("S")


async def drive(
    mailbox: Mailbox,
    advance: Callable[[S, Any], tuple[S, list[Command]]],
    state: S,
    event: object,
    *,
    settled: Callable[[S], bool],
    spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
    seen: Callable[[S], None] = lambda _: None,
) -> S:
    """Feed ``event`` to a machine that sends one store request at a time, then carry out
    its commands until it is ``settled`` with nothing to send: requests in turn, ``WakeAt``
    as a sleep, deletions handed to ``spawn`` (background), notices logged."""
    while True:
        state, cmds = advance(state, event)
        seen(state)
        request: Command | None = None
        wake: float | None = None
        for cmd in cmds:
            if isinstance(cmd, WakeAt):
                wake = cmd.at_s
            elif isinstance(cmd, Delete):
                if spawn is None:
                    raise TypeError("this machine deletes: drive it with spawn=")
                spawn(_delete(mailbox, cmd))
            elif isinstance(cmd, Notify):
                LOG.info("%s: %s", cmd.kind, cmd.detail)
            else:
                request = cmd
        if request is None and settled(state):
            return state
        if request is not None:
            event = await _carry(mailbox, request)
        elif wake is not None:
            await asyncio.sleep(max(0.0, wake - _now()))
            event = TimerFired(now_s=max(_now(), wake))
        else:
            raise RuntimeError(f"a machine is stuck: {state!r:.300}")  # a core bug


async def _delete(mailbox: Mailbox, cmd: Delete) -> None:
    try:
        await mailbox.delete(cmd.keys)
    except Exception as error:  # collection only: the objects that replace them speak
        LOG.info("could not delete %d objects: %s", len(cmd.keys), error)


def log_rejections(where: str, rejections: Sequence[Any], rejected: int, seen: int) -> int:
    """Log the rejections a machine made since it had made ``seen``; returns the new count."""
    fresh = min(rejected - seen, len(rejections))
    for rejection in rejections[len(rejections) - fresh :]:
        verdict = getattr(rejection, "verdict", None)
        why = f" ({verdict.value})" if verdict is not None else ""
        LOG.warning("%s: rejected %s%s: %s", where, rejection.key, why, rejection.detail)
    return rejected


async def _carry(mailbox: Mailbox, cmd: Command) -> Event:
    req = getattr(cmd, "req", 0)
    try:
        if isinstance(cmd, Get):
            try:
                got = await mailbox.get(cmd.key, max_bytes=core.BODY_MAX_BYTES + HEADER_MAX_BYTES)
            except TooLargeError as refused:
                # Handed over as bytes that do not decode: the core refuses them by name.
                return GotObject(now_s=_now(), req=req, data=b"", etag=refused.etag)
            data, etag = (None, None) if got is None else (got.data, got.etag)
            return GotObject(now_s=_now(), req=req, data=data, etag=etag)
        if isinstance(cmd, Probe):
            return Probed(now_s=_now(), req=req, etag=await mailbox.probe(cmd.key))
        if isinstance(cmd, PutOnce):
            outcome = await mailbox.put_once(cmd.key, cmd.data)
            return PutDone(now_s=_now(), req=req, created=outcome is PutOutcome.CREATED)
        if isinstance(cmd, List):
            items = await mailbox.list(cmd.prefix, offset=cmd.offset)
            return Listed(now_s=_now(), req=req, keys=tuple(item.key for item in items))
    except Exception as error:  # every failure is the machine's to answer
        return RequestFailed(now_s=_now(), req=req, error=f"{type(error).__name__}: {error}")
    raise TypeError(f"a queue sends no {cmd!r}")
