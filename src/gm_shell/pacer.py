"""The training thread's side of a session: a counter, a barrier, and work handed over.

Theory of operation
-------------------
``Session.step()`` runs after every optimizer step and must cost next to
nothing. The core tells the shell, through :class:`~gm_core.commands.Pace`, the
next local step at which it needs to hear of progress; until then ``step()``
only increments :attr:`Pacer.step` and compares it with :attr:`Pacer.barrier`.

The loop thread lowers the barrier to 0 whenever the training thread has
something to do — a fragment to capture, a fetched commit to fold into the
model — or must stop (a stall). Then the next ``step()`` takes a slower path.

The due step, without waiting. At the step the core waits for, the training
thread must not wait for the loop: a round trip costs two GIL hand-offs, each
as long as whatever Python the other thread runs meanwhile. So the loop asks
the core in advance what it will say to that step — :meth:`Runtime._forecast`
feeds a hypothetical ``Stepped`` to the pure ``advance`` and keeps only its
captures and its next pace — and hands the answer over as a :class:`Plan`, with
the buffers its copies go to (:meth:`Replica.prepare`). At that step
:meth:`Pacer.stepped` copies the planned fragments into them, CPU parameters
without a check the loop makes after the fact (:meth:`Replica.take_planned`,
:class:`gm_shell.models.DirectCopy`), leaves a :class:`StepNote` for the loop,
adopts the planned pace, and returns; it signals the loop without waiting for it. Where
the core would stall that step only until a commit the training thread already
holds is folded in, the plan says so (:attr:`Plan.applied`): the step folds it
in and then copies, the order the slow path would take, minus its waits.

Why the plan is what the core will say: the loop feeds the notes the training
thread left before anything else, makes the plan at the end of a feed from the
state it leaves, and commits the feed — that state, the work and pace it hands
over, the plan — at once under :attr:`Pacer.lock`, only if the training thread
changed nothing meanwhile (:attr:`Pacer.version`); else it computes the feed
again, the notes left meanwhile first (``Runtime._feed``). The training thread
takes a plan only under that lock, so the ``Stepped`` of a note meets exactly
the state its plan was made from, and ``advance`` is a function. Neither thread
holds the lock for long (the training thread for its copies, the loop to commit
a feed it has computed), never for a transition: a due step does not wait for
one (waiting for a lock lets go of the GIL, and winning it back can take the
switch interval). The loop checks it all the same: a note whose captures or pace differ
from what the core then says stops the runtime (a bug, never a guess).

A step that is not due but has commits to fold in does them and leaves an
:class:`AppliedNote`, also without waiting. A planned step folds in only the
commits its plan needs; others queued then wait for the next step (the barrier
stays down), so the copy is all a due step does in the common case: folding a
commit in costs more than the copy (a read, the alignment arithmetic, a write
back), and numpy's arithmetic lets go of the GIL, which the loop thread may then
hold for up to the interpreter's switch interval. The core hears of the commit
applied one step later, as if it had arrived a step later. Where no plan fits — the core will
stall training at that step, the step is past the planned one (the pace arrived
late) — or training is stalled, the slow path, :meth:`Pacer.serve`, does what
it always did:

1. if the step reached the barrier, report the step and tokens to the core and
   wait for it to digest them (a round trip to the loop), so any capture it asks
   for is of this step;
2. take the queued work and do it here, captures before commits: every
   capture in the queue was asked for against the anchors the model holds now,
   since a commit counts as applied only once the core hears of it;
3. return once nothing is queued and the core has not stalled training, or
   wait (bounded) for the loop to say more.

A step the core stalled until a commit arrives is waiting in step 3 when the
commit is handed over; the loop then asks the core what it will say once that
commit is folded in at this step (:meth:`Runtime._forecast`, a plan with
:attr:`Plan.resumes`), and where that lets training go on the training thread
folds it in, makes the copies and returns, leaving a note, instead of waiting
for the loop to hear of the fold-in and lift the stall (about 7 ms of hand-offs
per stall at load 16-25 on 2 cores).

Joining and closing use the same loop with another end condition. The pacer
itself decides nothing; it carries out the core's commands in order.

Ownership. The model's parameters are read and written only on the training
thread, inside ``Session`` calls (here and in :mod:`gm_shell.replica`): the
loop thread and the workers never touch them. What crosses over are buffers —
a :class:`~gm_shell.replica.Taken` belongs to the loop once its note is left,
and a committed array is never written by anyone — and the notes, in the order
the training thread left them, under the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

import attrs

from gm_core.commands import Pace
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment
from gm_shell.replica import Prepared, Replica, Taken, new_tuple

CAPTURE_WAIT_S = 2.0
"""How long :meth:`Pacer.serve` waits for an encoded capture's buffer before it allocates
another (:meth:`gm_shell.replica.Replica.wait_for_free`): an encode of a fragment takes far
less; a buffer that never comes back costs this once per capture, then memory."""


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


@attrs.frozen
class Plan:
    """What the core will answer when it hears of ``step`` (asked of the core itself)."""

    step: int
    captures: tuple[tuple[int, int], ...]
    """(round, fragment) of every capture it will ask for, in its order."""
    next_step: int
    """The step it will wait for next (a plan exists only where training goes on)."""
    applied: tuple[int, ...] = ()
    """Commits queued for the training thread (their ``req``) that it folds in at this
    step before the copies: the core would stall the step until they were."""
    resumes: bool = False
    """The core heard of ``step`` already and stalled it until ``applied`` are folded in;
    the plan is what it says then (the training thread waits in :meth:`Pacer.serve`)."""


class StepNote(NamedTuple):
    """Training reached ``plan.step``: the copies ``plan`` asked for, made at that step.

    Notes are named tuples, made on the training thread (see :class:`Taken`)."""

    step: int
    tokens: int
    plan: Plan
    taken: tuple[Taken, ...]


class CaptureNote(NamedTuple):
    """A capture the core asked for by command (``req``), made at the training step."""

    req: int
    taken: Taken


class AppliedNote(NamedTuple):
    """A commit folded into the model at ``step``."""

    req: int
    step: int
    tokens: int


Note = StepNote | CaptureNote | AppliedNote


def queued_applies(work: list[Work]) -> tuple[int, ...]:
    """The commits in ``work`` (their ``req``), if nothing else is in it."""
    if all(isinstance(item, ApplyWork) for item in work):
        return tuple(item.req for item in work if isinstance(item, ApplyWork))
    return ()


class Waits(NamedTuple):
    """How often the training thread waited for the loop (see :attr:`Pacer.waits`)."""

    round_trips: int
    """Steps reported to the core and waited for (:meth:`Link.report`)."""
    sleeps: int
    """Waits on the condition in :meth:`Pacer.serve` for the loop to say more."""
    contended: int
    """Times its fast paths (:meth:`Pacer.stepped` without a wait) found the pacer's lock
    held by the loop, and waited for it."""


class Link(Protocol):
    """What the pacer needs from the runtime."""

    def report(self, step: int, tokens: int) -> None:
        """Feed ``Stepped`` and wait until the core has digested it (a round trip)."""
        ...

    @property
    def wake(self) -> Callable[[], None]:
        """Notes are waiting: have the loop feed them soon; never blocks (read once: the
        pacer calls what it returned, one call less on a due step)."""
        ...


class Pacer:
    """Counters the training loop bumps, and the handoff of work between the threads."""

    def __init__(self, replica: Replica, link: Link, *, keep_copies: bool) -> None:
        self.step = 0
        self.tokens = 0
        self.barrier = 0
        self._replica = replica
        self._link = link
        self._keep_copies = keep_copies
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._work: list[Work] = []
        self._notes: list[Note] = []
        self._signalled = False
        self._plan: Plan | None = None
        self._prepared: tuple[Prepared, ...] = ()
        """The buffers ``_plan``'s captures copy into, made ready by the loop."""
        self._next_step = 0
        self._stalled = True
        self._failure: BaseException | None = None
        self._reported = (-1, -1)
        self.waiting: Callable[[], None] | None = None
        """Called on the training thread about once a second while :meth:`serve` waits (a
        group's leader tells its ranks it is alive: :mod:`gm_shell.group`)."""
        self.version = 0
        """Bumped (under the lock) whenever the training thread changes what a feed reads:
        its notes, its queue, the plan it carried out (see ``Runtime._feed``)."""
        self.planned = 0
        """Steps carried out from their plan by :meth:`_go_on` (a stalled step resumed by
        :meth:`serve` is not counted: it waited)."""
        self._wake = link.wake
        self._round_trips = self._sleeps = self._contended = 0

    @property
    def lock(self) -> threading.RLock:
        """Held by the loop to commit a feed (reentrant), by the training thread to
        take a plan and leave notes. (The training thread's fast paths take it directly,
        not through the condition: one Python call less, which counts on a due step.)"""
        return self._lock

    # -- the loop's side --------------------------------------------------------------------

    def publish(self, work: list[Work], pace: Pace | None) -> None:
        """New work and/or a new pace from one transition, made visible at once."""
        with self._cond:
            self._work.extend(work)
            if pace is not None:
                self._next_step, self._stalled = pace.next_step, pace.stalled
            self._refresh()
            self._cond.notify_all()

    def plan(self, plan: Plan | None, prepared: tuple[Prepared, ...] | None = None) -> None:
        """What the core will say at the step it waits for (None: ask it then), and the
        buffers its captures copy into (:meth:`Replica.prepare`; made here if not given)."""
        if prepared is None:
            prepared = self._replica.prepare(plan.captures) if plan is not None else ()
        with self._cond:
            old = {(p.round, p.fragment): p for p in self._prepared if p.theta is not None}
            # A capture the plan before prepared for keeps its buffer (Replica.prepare's held).
            prepared = tuple(
                old.pop((p.round, p.fragment), p) if p.theta is None else p for p in prepared
            )
            self._replica.unprepare(tuple(old.values()))
            self._plan, self._prepared = plan, prepared

    def prepared_captures(self) -> frozenset[tuple[int, int]]:
        """The captures (round, fragment) the plan now holds buffers for (a hint, any
        thread: the training thread may carry the plan out meanwhile)."""
        return frozenset((p.round, p.fragment) for p in self._prepared if p.theta is not None)

    def view(self) -> tuple[int, list[Note], list[Work]]:
        """The version, notes and queue as they are now (a feed's starting point)."""
        with self._lock:
            return self.version, list(self._notes), list(self._work)

    def take_notes(self) -> list[Note]:
        """The notes the training thread left, oldest first."""
        with self._cond:
            notes, self._notes = self._notes, []
            self._signalled = False
            return notes

    def fail(self, error: BaseException) -> None:
        """The runtime cannot go on: the training thread raises ``error`` at its next step."""
        with self._cond:
            self._failure = error
            self.barrier = 0
            self._cond.notify_all()

    def restart(self) -> None:
        """The learner machine starts again from the tape: its work, plan and pace are void.

        Training stalls (the barrier drops, the next step reports and waits) until the
        fresh machine has joined and lets it go on, as at the session's start; the
        step and token counts go on.
        """
        with self._cond:
            self._work, self._notes, self._signalled = [], [], False
            self._replica.unprepare(self._prepared)
            self._plan, self._prepared, self._next_step, self._stalled = None, (), 0, True
            self._reported = (-1, -1)
            self._refresh()
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _refresh(self) -> None:
        self.barrier = 0 if (self._work or self._stalled) else self._next_step

    @property
    def stalled(self) -> bool:
        return self._stalled

    def planned_for(self, step: int) -> bool:
        """Whether a due ``step`` taken now would be carried out by the plan held (a plan
        whose commits were folded in at an earlier step waits for the loop to make anew)."""
        with self._lock:
            return self._usable_plan(resumes=False, step=step) is not None

    @property
    def waits(self) -> Waits:
        """The training thread's waits for the loop so far: a due step that has its plan
        makes none (what ``tests/runtime/test_due_step.py`` counts; timing is bench's)."""
        return Waits(self._round_trips, self._sleeps, self._contended)

    def _acquire(self) -> None:
        """Take the lock on the training thread, counting it if the loop holds it."""
        if not self._lock.acquire(blocking=False):
            self._contended += 1
            self._lock.acquire()

    # -- the training thread's side -----------------------------------------------------------

    def stepped(self, timeout_s: float, why: Callable[[], str]) -> None:
        """A step that reached the barrier: done here without waiting for the loop where
        the core need not hear of it first (its planned due step, commits to fold in),
        else :meth:`serve`."""
        if not self._go_on():
            self.serve(self.running, timeout_s, why, resume=True)

    def _usable_plan(self, resumes: bool, step: int | None = None) -> Plan | None:
        """The plan for this step (or ``step``), if the queue still holds what it was made
        with (under the lock)."""
        plan = self._plan
        if plan is None or plan.step != (self.step if step is None else step):
            return None
        if plan.resumes != resumes:
            return None
        if plan.applied and queued_applies(self._work) != plan.applied:
            return None  # the queue changed since (a forgotten snapshot): ask the core
        return plan

    def _carry_out(self, plan: Plan) -> None:
        """Fold in the commits ``plan`` needs, copy what it asks, leave the note and adopt
        its pace (under the lock)."""
        if plan.applied:  # the queue holds exactly these commits (see _usable_plan)
            self._fold_in(self._work)
            self._work = []
        taken = self._replica.take_planned(self._prepared, self._keep_copies)
        self._notes.append(new_tuple(StepNote, (self.step, self.tokens, plan, taken)))
        self._plan, self._prepared = None, ()
        self._next_step, self._stalled = plan.next_step, False
        self._reported = (self.step, self.tokens)
        self.version += 1

    def _go_on(self) -> bool:
        """Carry out this step's plan and the queued work, unless the loop must answer first.

        The common due step — a plan for it and nothing else queued — takes the lock once,
        copies, leaves its note and signals the loop (:attr:`Link.wake`, which never waits).
        (:meth:`_acquire` written out: a Python call costs microseconds on a cold due step.)"""
        lock = self._lock
        if not lock.acquire(blocking=False):
            self._contended += 1
            lock.acquire()
        try:
            if self._failure is not None or self._stalled:
                return False
            plan = self._usable_plan(resumes=False)
            if plan is None and self.step >= self._next_step:
                return False  # due, and nobody knows what the core will say: ask it
            work: list[Work] = []
            if plan is not None:
                assert plan.step == self._next_step, "a plan outlived its pace"
                self._carry_out(plan)
                self.planned += 1
                if self._work:  # commits the plan does not need wait (see the module doc)
                    work = [w for w in self._work if isinstance(w, CaptureWork)]
                    self._work = [w for w in self._work if not isinstance(w, CaptureWork)]
            else:
                work, self._work = self._work, []
            if work:
                self.version += 1
            self._refresh()
            signal = not work and bool(self._notes) and not self._signalled
            self._signalled = self._signalled or signal
        finally:
            lock.release()
        if work:
            self._perform(work)
        elif signal:
            self._wake()
        return True

    def serve(
        self,
        done: Callable[[], bool],
        timeout_s: float,
        why: Callable[[], str],
        *,
        report: bool = False,
        resume: bool = False,
    ) -> None:
        """Report, do queued work, and wait until ``done()`` (or raise StalledError).

        The step is reported when it reached the core's barrier (or ``report`` asks for
        it, as closing does); a slow path taken only to fold in a commit skips the round
        trip, and the commit is reported applied at this step, which the core accepts
        ahead of the steps it has heard of. With ``resume`` (a training step), a plan
        that says the core lets this step go on once the commits queued are folded in is
        carried out at once, without waiting for the loop to hear of them first.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self.waiting is not None:
                self.waiting()
            due = report or self.step >= self._next_step
            if due and (self.step, self.tokens) != self._reported:
                self._round_trips += 1
                self._link.report(self.step, self.tokens)
                self._reported = (self.step, self.tokens)
            with self._cond:
                if self._failure is not None:
                    raise RuntimeError("the gm session failed") from self._failure
                plan = self._usable_plan(resumes=True) if resume and self._stalled else None
                if plan is not None:
                    self._carry_out(plan)
                    self._refresh()
                    resumed = True
                else:
                    resumed = False
                work, self._work = self._work, []
                if work:
                    self.version += 1
                if not work and not resumed:
                    if done():
                        self._refresh()
                        return
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StalledError(why())
                    self._sleeps += 1
                    self._cond.wait(min(remaining, 1.0))
                    continue
            self._perform(work, streamed=True)
            if resumed:
                return

    def closing(self) -> None:
        """Captures from here on are not kept for ``carry`` (training thread, before the
        learner is asked to close): closing leaves the model at the newest commit
        (:meth:`gm_shell.session.Session.close`), so a commit folded in meanwhile has no
        progress of its own to carry over, and a copy per final delta (one per fragment:
        the whole model at once) would only hold memory."""
        self._keep_copies = False

    def running(self) -> bool:
        """End condition of a step: the core lets training go on (call under the lock)."""
        return not self._stalled

    def _perform(self, work: list[Work], *, streamed: bool = False) -> None:
        """Forget, capture, then apply (see the module doc); signal the loop once if notes
        wait (a step's note included).

        ``streamed`` (the training thread waits anyway: :meth:`serve`): a capture that
        would need a new buffer first hands the captures before it to the loop and waits
        (bounded) for one of their buffers to come back encoded (``carry`` copies are
        kept until their commits: not waited for)."""
        notes: list[Note] = []
        for item in work:
            if isinstance(item, ForgetWork):
                self._replica.forget(item.round)
        for item in work:
            if isinstance(item, CaptureWork):
                waits = streamed and not self._keep_copies
                if waits and not self._replica.has_free(item.fragment):
                    self._hand_over(notes)
                    notes = []
                    self._replica.wait_for_free(item.fragment, CAPTURE_WAIT_S)
                taken = self._replica.take(item.round, item.fragment, self._keep_copies)
                notes.append(CaptureNote(req=item.req, taken=taken))
        for item in self._fold_in(work):
            notes.append(AppliedNote(req=item.req, step=self.step, tokens=self.tokens))
        self._hand_over(notes)

    def _hand_over(self, notes: list[Note]) -> None:
        """Leave ``notes`` for the loop; signal it once if notes wait (a step's included)."""
        self._acquire()
        try:
            if notes:
                self._notes.extend(notes)
                self.version += 1
            signal = bool(self._notes) and not self._signalled
            self._signalled = self._signalled or signal
        finally:
            self._lock.release()
        if signal:
            self._wake()

    def _fold_in(self, work: list[Work]) -> list[ApplyWork]:
        """Apply the commits in ``work``, in order (forgotten snapshots first); the ones applied."""
        for item in work:
            if isinstance(item, ForgetWork):
                self._replica.forget(item.round)
        applied = [item for item in work if isinstance(item, ApplyWork)]
        for item in applied:
            self._replica.apply(item.round, item.fragment, item.committed, item.mode, item.mixing)
        return applied
