"""The training thread's side of a session: a counter, a barrier, and work handed over.

Theory of operation
-------------------
``Session.step()`` runs after every optimizer step and must cost next to
nothing. The core tells the shell, through :class:`~gm_core.commands.Pace`, the
next local step at which it needs to hear of progress; until then ``step()``
only increments :attr:`Pacer.step` and compares it with :attr:`Pacer.barrier`.

The loop thread lowers the barrier to 0 whenever the training thread has
something to do — a fragment to capture (at exactly this step), a fetched
commit to fold into the model — or must stop (a stall). Then the next
``step()`` takes the slow path, :meth:`Pacer.serve`:

1. if the step reached the barrier, report the step and tokens to the core and
   wait for it to digest them (a round trip to the loop), so any capture it asks
   for is of this step;
2. take the queued work and do it here, captures before commits: every
   capture in the queue was asked for against the anchors the model holds now,
   since a commit counts as applied only once the core hears of it;
3. return once nothing is queued and the core has not stalled training, or
   wait (bounded) for the loop to say more.

Joining and closing use the same loop with another end condition. The pacer
itself decides nothing; it carries out the core's commands in order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import attrs

from gm_core.commands import Pace
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment
from gm_shell.replica import Replica


class StalledError(RuntimeError):
    """Training waited longer than allowed for the run (a join, a commit, a close)."""


@attrs.frozen(eq=False)
class CaptureWork:
    req: int
    round: int
    fragment: int


@attrs.frozen(eq=False)
class ApplyWork:
    req: int
    round: int
    fragment: int
    committed: F32
    mode: Alignment
    mixing: float


@attrs.frozen(eq=False)
class ForgetWork:
    round: int


Work = CaptureWork | ApplyWork | ForgetWork


class Link(Protocol):
    """What the pacer needs from the runtime (each call crosses to the loop thread)."""

    def report(self, step: int, tokens: int) -> None:
        """Feed ``Stepped`` and wait until the core has digested it."""
        ...

    def captured(self, work: CaptureWork, delta: F32) -> None: ...

    def applied(self, work: ApplyWork, step: int, tokens: int) -> None: ...


class Pacer:
    """Counters the training loop bumps, and the handoff of work from the loop."""

    def __init__(self, replica: Replica, link: Link, *, keep_copies: bool) -> None:
        self.step = 0
        self.tokens = 0
        self.barrier = 0
        self._replica = replica
        self._link = link
        self._keep_copies = keep_copies
        self._cond = threading.Condition()
        self._work: list[Work] = []
        self._next_step = 0
        self._stalled = True
        self._failure: BaseException | None = None
        self._reported = (-1, -1)

    # -- the loop's side --------------------------------------------------------------------

    def publish(self, work: list[Work], pace: Pace | None) -> None:
        """New work and/or a new pace from one transition, made visible at once."""
        with self._cond:
            self._work.extend(work)
            if pace is not None:
                self._next_step, self._stalled = pace.next_step, pace.stalled
            self._refresh()
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The runtime cannot go on: the training thread raises ``error`` at its next step."""
        with self._cond:
            self._failure = error
            self.barrier = 0
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _refresh(self) -> None:
        self.barrier = 0 if (self._work or self._stalled) else self._next_step

    @property
    def stalled(self) -> bool:
        return self._stalled

    # -- the training thread's side -----------------------------------------------------------

    def serve(
        self,
        done: Callable[[], bool],
        timeout_s: float,
        why: Callable[[], str],
        *,
        report: bool = False,
    ) -> None:
        """Report, do queued work, and wait until ``done()`` (or raise StalledError).

        The step is reported when it reached the core's barrier (or ``report`` asks for
        it, as closing does); a slow path taken only to fold in a commit skips the round
        trip, and the commit is reported applied at this step, which the core accepts
        ahead of the steps it has heard of.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            due = report or self.step >= self._next_step
            if due and (self.step, self.tokens) != self._reported:
                self._link.report(self.step, self.tokens)
                self._reported = (self.step, self.tokens)
            with self._cond:
                if self._failure is not None:
                    raise RuntimeError("the gm session failed") from self._failure
                work, self._work = self._work, []
                if not work:
                    if done():
                        self._refresh()
                        return
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StalledError(why())
                    self._cond.wait(min(remaining, 1.0))
                    continue
            self._perform(work)

    def running(self) -> bool:
        """End condition of a step: the core lets training go on (call under the lock)."""
        return not self._stalled

    def _perform(self, work: list[Work]) -> None:
        for item in work:
            if isinstance(item, ForgetWork):
                self._replica.forget(item.round)
        for item in work:
            if isinstance(item, CaptureWork):
                delta = self._replica.capture(item.round, item.fragment, self._keep_copies)
                self._link.captured(item, delta)
        for item in work:
            if isinstance(item, ApplyWork):
                self._replica.apply(
                    item.round, item.fragment, item.committed, item.mode, item.mixing
                )
                self._link.applied(item, self.step, self.tokens)
