"""``Barrier``: hold processes at a named point until ``parties`` of them have arrived.

Theory of operation
-------------------
::

    with Barrier("epoch", parties=4, mailbox="s3://bucket/run", party=node) as b:
        for epoch in range(10):
            train_one_epoch()
            b.wait()                       # returns once 4 parties arrived here

Every decision is :mod:`gm_core.barrier`'s (which generation to arrive at, when
a generation is released, who it holds, when a wait has timed out); this module
only carries out its commands on a :class:`~gm_shell.mailbox.Mailbox`:
``List``/``Get``/``PutOnce`` one at a time, deletions of arrivals a marker made
useless in the background, ``WakeAt`` as a timer on the loop's monotonic clock
(the only clock a wait reads: nothing written by another machine is compared
with it). A failed request becomes ``RequestFailed``, which the machine answers
by looking again at its next poll.

A :class:`Barrier` remembers the generation it was last released from, so each
``wait()`` on the same object is the next generation, as with
:class:`threading.Barrier`. A new object (a restarted process) starts at the
lowest open generation, resuming its own arrival there if it made one. A wait
that times out raises :class:`BarrierTimeoutError` naming the parties that had
arrived; its arrival stays (an arrival is never withdrawn), and the generation is
broken for every party, which all raise the same error. Marker reads are capped
(:data:`gm_core.barrier.MARKER_MAX_BYTES`); anything in the barrier's folder
that the core refuses is logged by name with its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType

from gm_core import barrier
from gm_core.auth import Envelope
from gm_core.commands import Command, Delete, Get, List, Notify, PutOnce, WakeAt
from gm_core.events import Event, GotObject, Listed, PutDone, RequestFailed, Started, TimerFired
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox, PutOutcome, TooLargeError
from gm_shell.stores import MailboxOptions

LOG = logging.getLogger("gm")

__all__ = ["Barrier", "BarrierMismatchError", "BarrierTimeoutError", "wait_once"]


class BarrierTimeoutError(TimeoutError):
    """A barrier's generation was not released before a party's deadline.

    ``arrived`` names the parties that had arrived (as the party that broke the
    generation saw them); ``by`` is that party (this one, or one whose deadline
    came first).
    """

    def __init__(self, spec: barrier.BarrierSpec, result: barrier.TimedOut) -> None:
        super().__init__(barrier.describe(spec, result))
        self.name = spec.name
        self.parties = spec.parties
        self.generation = result.generation
        self.arrived = result.arrived
        self.by = result.by


class BarrierMismatchError(ValueError):
    """The generation was released by a party that waits for a different number of parties."""


def now() -> float:
    """The waiter's clock: monotonic, the one asyncio's timers use."""
    return time.monotonic()


async def wait_once(mailbox: Mailbox, spec: barrier.BarrierSpec) -> barrier.Result:
    """Run one wait's machine to its end on the running loop and return how it ended."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()
    timer: asyncio.TimerHandle | None = None
    background: set[asyncio.Task[None]] = set()
    state = barrier.initial(spec)
    seen_rejections = 0

    async def carry_out(cmd: Command) -> None:
        try:
            events.put_nowait(await _store(mailbox, cmd))
        except Exception as error:  # every failure is the machine's to answer
            req = getattr(cmd, "req", 0)
            events.put_nowait(RequestFailed(now_s=now(), req=req, error=_describe(error)))

    async def delete(cmd: Delete) -> None:
        try:
            await mailbox.delete(cmd.keys)
        except Exception as error:  # garbage collection only: the next marker writer retries
            LOG.info(
                "barrier %s: could not delete %d arrivals: %s", spec.name, len(cmd.keys), error
            )

    def fire(at_s: float) -> None:
        # asyncio may run a timer a clock tick early; the machine must see its time passed.
        events.put_nowait(TimerFired(now_s=max(now(), at_s)))

    def spawn(work: asyncio.Task[None]) -> None:
        background.add(work)
        work.add_done_callback(background.discard)

    events.put_nowait(Started(now_s=now()))
    try:
        while state.result is None:
            state, cmds = barrier.advance(state, await events.get())
            for cmd in cmds:
                if isinstance(cmd, WakeAt):
                    if timer is not None:
                        timer.cancel()
                    timer = loop.call_at(cmd.at_s, fire, cmd.at_s)
                elif isinstance(cmd, Delete):
                    spawn(loop.create_task(delete(cmd)))
                elif isinstance(cmd, Notify):
                    LOG.info("%s: %s", spec.party, cmd.detail)
                else:
                    spawn(loop.create_task(carry_out(cmd)))
            fresh = min(state.rejected - seen_rejections, len(state.rejections))
            for rejection in state.rejections[len(state.rejections) - fresh :]:
                LOG.warning(
                    "barrier %s: rejected %s (%s): %s",
                    spec.name,
                    rejection.key,
                    rejection.verdict.value,
                    rejection.detail,
                )
            seen_rejections = state.rejected
        return state.result
    finally:
        if timer is not None:
            timer.cancel()
        for task in list(background):
            if not task.done():
                task.cancel()
        # Deletions already sent land or fail on their own; awaiting them bounds nothing here.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*background, return_exceptions=True)


async def _store(mailbox: Mailbox, cmd: Command) -> Event:
    if isinstance(cmd, Get):
        try:
            got = await mailbox.get(cmd.key, max_bytes=barrier.MARKER_MAX_BYTES)
        except TooLargeError as refused:
            # Handed over as bytes that do not decode: the core refuses them by name.
            LOG.warning("barrier marker %s refused unread: %s", cmd.key, refused)
            return GotObject(now_s=now(), req=cmd.req, data=b"", etag=refused.etag)
        data, etag = (None, None) if got is None else (got.data, got.etag)
        return GotObject(now_s=now(), req=cmd.req, data=data, etag=etag)
    if isinstance(cmd, PutOnce):
        outcome = await mailbox.put_once(cmd.key, cmd.data)
        return PutDone(now_s=now(), req=cmd.req, created=outcome is PutOutcome.CREATED)
    if isinstance(cmd, List):
        items = await mailbox.list(cmd.prefix, offset=cmd.offset)
        return Listed(now_s=now(), req=cmd.req, keys=tuple(item.key for item in items))
    raise TypeError(f"a barrier sends no {cmd!r}")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class Barrier:
    """A reusable rendezvous of ``parties`` processes through a run's bucket.

    Args:
        name: the barrier's id (``[A-Za-z0-9._-]``, 1-64 characters); every party
            passes the same name and ``parties``.
        parties: how many parties each generation releases together.
        mailbox: the bucket's URL (as :class:`~gm_shell.Session` takes it) or an open
            :class:`~gm_shell.mailbox.Mailbox` that nothing else drives meanwhile.
        party: this process's id, unique among the parties; a restarted process that
            passes the same id resumes its arrival at a generation still open.
        timeout_s: how long a wait may last, on this process's clock, before it
            raises :class:`BarrierTimeoutError` (and breaks the generation for all).
        poll_s: how often a waiting party lists the generation.
        mailbox_options: how to reach the bucket when ``mailbox`` is a URL.
        loop: the loop thread that drives ``mailbox`` (a session's: see
            :meth:`gm_shell.Session.barrier`); by default the barrier runs one of its own.
        envelope: the run's envelope (set by :meth:`gm_shell.Session.barrier`): in an
            authenticated run arrivals and verdicts get names only holders of the run key
            can compute, so an outsider can neither arrive nor release. Without it the
            names are plain: in an authenticated run, wait through the session's barrier.
    """

    def __init__(
        self,
        name: str,
        *,
        parties: int,
        mailbox: str | Mailbox,
        party: str,
        timeout_s: float = 600.0,
        poll_s: float = 1.0,
        mailbox_options: MailboxOptions | None = None,
        loop: LoopThread | None = None,
        envelope: Envelope | None = None,
    ) -> None:
        # Checked now, so misuse raises here rather than at the first wait.
        barrier.BarrierSpec(
            name=name, party=party, parties=parties, timeout_s=timeout_s, poll_s=poll_s
        )
        self.name, self.party, self.parties = name, party, parties
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._envelope = envelope
        self.generation: int | None = None
        """The generation this object was last released from (None: not yet)."""
        self._own_loop = loop is None
        self._loop = LoopThread(f"gm-barrier-{party}") if loop is None else loop
        self._owned = not isinstance(mailbox, Mailbox)
        self._mailbox = (
            mailbox
            if isinstance(mailbox, Mailbox)
            else Mailbox.open(mailbox, options=mailbox_options)
        )

    def wait(self, timeout_s: float | None = None) -> tuple[str, ...]:
        """Arrive and block until the generation is released; returns its parties (sorted).

        Raises:
            BarrierTimeoutError: no release within ``timeout_s`` (default: the barrier's).
            BarrierMismatchError: another party released it for a different ``parties``.
        """
        spec = barrier.BarrierSpec(
            name=self.name,
            party=self.party,
            parties=self.parties,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            poll_s=self.poll_s,
            first=0 if self.generation is None else self.generation + 1,
            envelope=self._envelope,
        )
        result = self._loop.run(wait_once(self._mailbox, spec))
        if isinstance(result, barrier.TimedOut):
            raise BarrierTimeoutError(spec, result)
        if isinstance(result, barrier.Mismatched):
            raise BarrierMismatchError(barrier.describe(spec, result))
        self.generation = result.generation
        return result.members

    def close(self) -> None:
        """Stop what this barrier started (its loop, the mailbox it opened); nothing else."""
        if self._own_loop:
            self._loop.stop()
        if self._owned:
            self._mailbox.close()

    def __enter__(self) -> Barrier:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
