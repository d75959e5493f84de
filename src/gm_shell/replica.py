"""A learner's replica: its model's fragments, the anchors it trains from, and carry copies.

Theory of operation
-------------------
A learner publishes ``anchor − θ`` for a fragment, where the *anchor* is the
committed value of that fragment it last aligned with. The replica keeps one
flat fp32 host copy of each anchor, and does the two things that must happen
on the training thread, between optimizer steps, at the step the core chose:

- :meth:`Replica.take` — a copy of one fragment as the model holds it now, with
  the anchor its delta ``anchor − θ`` is to be taken from (:class:`Taken`; the
  subtraction is left to a worker thread). For ``carry`` alignment it also keeps
  θ at that moment, since carry replays exactly the steps trained after it;
- :meth:`Replica.apply` — fold a committed fragment into the model by the
  run's alignment rule, then make it the new anchor.

``carry`` when this learner took no snapshot of the round (it had not trained
that fragment, or it joined later): the commit's change is laid over the local
progress, ``θ ← θ + (Θ − anchor)``, i.e. carry with the old anchor as the
snapshot. The core then keeps counting steps from the old anchor, so the next
delta ``Θ − θ`` is again exactly the local steps it reports.

Buffers. A copy is made into a buffer kept from an earlier capture, which the
loop takes from the pool before a planned due step (:meth:`Replica.prepare`,
with the byte views the copy writes), so a due step only copies (no allocation
or page faults: on a due step that follows a pause, a fresh ``numpy.empty`` alone
costs tens of microseconds of cold code; a buffer the loop makes afresh there, it
faults in itself). The pool is the replica's, not a fragment's: a buffer holds the
largest fragment and lends its head to whichever fragment of at least half that size
needs one, so what it keeps free is :data:`POOLED` buffer of one fragment whatever the
fragment count (a pool per fragment kept free buffers of each: twice the model, idle);
a smaller fragment gets buffers of its own size (:func:`lendable`). Ownership
passes with the :class:`Taken`: the worker that encodes the delta gives the
buffer back (:meth:`Taken.delta` then :meth:`Replica.recycle`), except a
``carry`` copy, which the replica keeps until the round's commit is applied;
it is free again when that commit used it as the snapshot, since the commit's
record names the delta, which the worker had finished encoding before it was
uploaded. A plan whose step folds such a commit in before its capture copies into
the copy given back, and a plan remade keeps the buffers of the one it replaces
(:meth:`Replica.prepare`): a ``carry`` learner holds its copies out and one buffer more,
however many times a round its plan is remade. Folding a commit in works on the
parameters' own memory where numpy can write it (CPU fp32 torch: no copy of the
fragment), else on a free buffer as its scratch (the pool then keeps one more).
Closing captures every fragment's final delta at once: those copies are not kept
(closing leaves the newest commit: :meth:`gm_shell.pacer.Pacer.closing`), and each
capture waits for an earlier one's buffer to come back encoded
(:meth:`Replica.wait_for_free`), so closing holds two buffers, not the model.

Anchors are fp32, and they are the commit *as the model holds it*: a bf16 model
holds a committed fp32 value rounded to bf16, and anchoring at the unrounded
value would publish that rounding as if it were training (a zero-step delta
would not be zero). The closer's master copy stays fp32; only the learner's
own progress, measured from what it started from, travels.

The replica never decides anything; it only does what a command asked.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, cast

import numpy as np

from gm_core.numerics import align
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment, FragmentPlan
from gm_shell.models import DirectCopy, FragmentAccess, InPlace, ModelAdapter

POOLED = 1
"""Free buffers the pool keeps. A ``carry`` copy that comes back when its round's commit is
folded in becomes the next capture's buffer; a second free one (the pool kept two before
session 24) held a fragment's bytes idle between captures: where one fragment is the whole
model, a model's bytes (measured: the closer-learner's growth in the one-fragment variant of
``tests/runtime/test_hostile_bucket.py`` 146-155 MiB with two, 116-134 with one). A
buffer made afresh for a planned capture is faulted in where it is prepared, by the loop,
so the due step still only copies (:meth:`Replica.prepare`)."""


IN_PLACE_SPAN = 1 << 16
"""The mean tensor length (fp32 values) from which a commit is folded into the parameters'
own memory, a tensor at a time: below it a tensor's own numpy calls (~4 us each) cost more
than a copy of it through one gathered buffer (a fragment of 64 tensors of 34 KiB in all:
62-119 us through the buffer, 270-293 us in place; 16 MiB in 16 tensors: 6.8-8.8 ms
through it, 2.7-4.0 ms in place; /tmp micro-benchmark of ``Replica.apply``, carry, session
21: bench/README.md "The fold in place")."""


class Taken(NamedTuple):
    """θ of one fragment copied at a due step, and the anchor its delta is taken from.

    The anchor is the committed array the model was aligned with at that step (anchors
    are replaced, never written, so a reference is enough). A named tuple, not an attrs
    value: it is made on the training thread's due step, where each field set through
    a frozen attrs ``__init__`` costs about as much as copying a small fragment.
    """

    round: int
    fragment: int
    anchor: F32
    theta: F32
    kept: bool
    """The replica keeps ``theta`` for carry: the delta goes to a fresh buffer."""
    bound: tuple[int, ...] | None = None
    """The data pointers of the parameters ``theta`` was copied from without a check (a
    planned due step), to be checked before it is published (:meth:`Replica.verify`)."""

    def delta(self, fresh: bool = False) -> F32:
        """``anchor − θ``: in place unless the replica kept θ or the caller keeps the
        delta past :meth:`Replica.recycle` (``fresh``) (any thread)."""
        if self.kept or fresh:
            return np.subtract(self.anchor, self.theta)
        return np.subtract(self.anchor, self.theta, out=self.theta)


new_tuple = tuple.__new__
"""Makes a named tuple from its fields without calling the class: its ``__new__`` is a Python
function reached through the type's slot, ~10 us of cold code after a training step of 10 ms
(~3 us this way), which counts on a due step."""


def lendable(capacity: int, size: int) -> bool:
    """Whether a buffer of ``capacity`` values is lent to a copy of ``size``: one at least
    half its size. Its pages stay resident whatever it holds next: the 16 MiB buffer of a
    model's big fragment lent to its 0.1 MiB one held 16 MiB beside each copy of it (a
    closer-learner's growth in the one-fragment variant of
    ``tests/runtime/test_hostile_bucket.py``, session 25)."""
    return size <= capacity <= 2 * size


def _pooled(buffer: F32) -> F32:
    """The pool's buffer whose head ``buffer`` is (see :meth:`Replica._buffer`)."""
    pooled = buffer.base
    assert isinstance(pooled, np.ndarray), "a buffer the pool did not lend"
    assert pooled.ndim == 1, "a buffer the pool did not lend"
    return pooled


class Prepared(NamedTuple):
    """A buffer made ready for a planned capture before its step (:meth:`Replica.prepare`)."""

    round: int
    fragment: int
    theta: F32 | None
    """None: the buffer is the ``carry`` copy a commit folded in at the same step, before
    the copy, gives back (:meth:`Replica.prepare`)."""
    copy: Callable[[], tuple[int, ...] | None] | None
    """Copies the parameters into ``theta`` directly, unchecked, and says from where (None:
    ``gather``; see :meth:`gm_shell.models.DirectCopy.copy_bound`)."""


class Replica:
    """The training thread's view of the model, fragment by fragment."""

    def __init__(self, model: ModelAdapter, plan: FragmentPlan) -> None:
        self.fragments: Sequence[FragmentAccess] = [model.fragment(n) for n in plan.fragments]
        self._anchors: list[F32 | None] = [None] * len(self.fragments)
        self._taken: dict[int, F32] = {}
        self._largest = max((access.layout.total for access in self.fragments), default=0)
        self._free: deque[F32] = deque()
        self._returned = threading.Condition()
        """Notified when a buffer comes back (:meth:`wait_for_free`)."""
        self._encoding = 0
        """Buffers of captures handed over and not yet given back (see :meth:`recycle`)."""
        self.buffers = 0
        """How many buffers the pool has made (what it costs: tests, bench_memory)."""
        self._keep_free = POOLED
        """Free buffers kept: one more once a commit was folded in through a buffer
        (:meth:`_fold`), which it takes beside the ``carry`` copy it reads."""

    def read(self, fragment: int) -> F32:
        """A fresh host copy of the fragment as the model holds it."""
        access = self.fragments[fragment]
        out = np.empty(access.layout.total, dtype=np.float32)
        access.gather(out)
        return out

    def take(self, round_: int, fragment: int, keep_copy: bool) -> Taken:
        """θ of ``fragment`` now, copied into a pooled buffer; kept for carry if asked."""
        anchor = self._anchors[fragment]
        assert anchor is not None, "a fragment is captured only after the join loaded it"
        theta = self._buffer(anchor.shape[0])
        self.fragments[fragment].gather(theta)
        if keep_copy:
            self._taken[round_] = theta
        else:
            self._lend(1)
        return Taken(round_, fragment, anchor, theta, keep_copy)

    def prepare(
        self,
        captures: Sequence[tuple[int, int]],
        releasing: Sequence[int] = (),
        held: Collection[tuple[int, int]] = (),
    ) -> tuple[Prepared, ...]:
        """Buffers for the captures (round, fragment) of a planned due step, with the byte
        views a direct copy writes (any thread: the due step then only copies).

        ``held``: captures the plan being replaced holds buffers for; they get none here
        (:meth:`gm_shell.pacer.Pacer.plan` hands the old ones on). A plan is remade each
        time the learner's state changes, several times a round: with one buffer kept free,
        each remake made and faulted in a fragment's buffer beside the one the old plan
        held, then let one go.

        ``releasing``: the rounds whose commits the step folds in first. A ``carry`` copy
        they give back is the buffer of a capture it is :func:`lendable` to, taken at the
        step itself: a learner with ``in_flight`` rounds out keeps their copies and makes
        no other (a buffer prepared beside them, while the oldest copy still waited for its
        commit, was a fragment's bytes more, then idle in the pool). That step folds a
        commit into the whole fragment; its copy is a checked one, from resident pages."""
        released = [len(_pooled(c)) for r in releasing if (c := self._taken.get(r)) is not None]
        prepared = []
        for round_, fragment in captures:
            if (round_, fragment) in held:
                prepared.append(Prepared(round_, fragment, None, None))
                continue
            access = self.fragments[fragment]
            size = access.layout.total
            reused = next((i for i, n in enumerate(released) if lendable(n, size)), None)
            if reused is not None:
                del released[reused]
                prepared.append(Prepared(round_, fragment, None, None))
                continue
            theta = self._buffer(size, fault_in=True)
            copy = None
            if isinstance(access, DirectCopy) and (slots := access.slots(theta)) is not None:
                copy = functools.partial(access.copy_bound, slots)
            prepared.append(Prepared(round_, fragment, theta, copy))
        return tuple(prepared)

    def unprepare(self, prepared: Sequence[Prepared]) -> None:
        """The buffers of a plan that was not carried out are free again (any thread)."""
        for item in prepared:
            if item.theta is not None:
                self._give_back(item.theta)

    def take_planned(self, prepared: Sequence[Prepared], keep_copy: bool) -> tuple[Taken, ...]:
        """θ of each prepared capture now, into its buffer: through the views the fragment
        bound last, unchecked where it has them (:meth:`verify` checks them before the copy
        is published), else by a checked ``gather``."""
        taken = []
        for round_, fragment, prepared_theta, copy in prepared:
            access = self.fragments[fragment]
            theta = prepared_theta
            if theta is None:  # a carry copy the fold-ins gave back, or a new one
                theta = self._buffer(access.layout.total)
            bound = None if copy is None else copy()
            if bound is None:
                access.gather(theta)
            if keep_copy:
                self._taken[round_] = theta
            anchor = self._anchors[fragment]
            assert anchor is not None, "a fragment is captured only after the join loaded it"
            taken.append(new_tuple(Taken, (round_, fragment, anchor, theta, keep_copy, bound)))
        if not keep_copy:
            self._lend(len(taken))
        return tuple(taken)

    def verify(self, taken: Taken) -> bool:
        """Whether ``taken`` was copied from where the parameters are (after the fact: see
        :class:`gm_shell.models.DirectCopy`); a copy made with the check always was."""
        if taken.bound is None:
            return True
        return cast(DirectCopy, self.fragments[taken.fragment]).bound_to(taken.bound)

    def _buffer(self, size: int, *, fault_in: bool = False) -> F32:
        """The first ``size`` elements of a free buffer that :func:`lendable` to them, or of
        a new one (any thread: the loop prepares plans while the training thread folds
        commits in). ``fault_in``: a new one's pages are written here, not by the copy the
        buffer is for (16 MiB: ~3 ms of page faults, which a due step would pay)."""
        with self._returned:
            at = self._fitting(size)
            if at is not None:  # by place, not by value (``remove`` would compare arrays)
                pooled = self._free[at]
                del self._free[at]
        if at is None:
            pooled = np.empty(self._capacity(size), dtype=np.float32)
            if fault_in:
                pooled[:size].fill(0.0)
            with self._returned:
                self.buffers += 1
        return pooled[:size]

    def _fitting(self, size: int) -> int | None:
        """Where the smallest free buffer :func:`lendable` to ``size`` values lies in the
        pool, if any (under the pool's lock)."""
        fits = [i for i, b in enumerate(self._free) if lendable(len(b), size)]
        return min(fits, key=lambda i: len(self._free[i])) if fits else None

    def _capacity(self, size: int) -> int:
        """What a new buffer for ``size`` elements holds: the largest fragment, so that any
        fragment of at least half its size may borrow it later, else ``size`` itself."""
        return self._largest if lendable(self._largest, size) else size

    def _give_back(self, buffer: F32) -> None:
        """The pooled buffer whose head ``buffer`` is, is free again (any thread)."""
        pooled = _pooled(buffer)
        with self._returned:
            self._free.append(pooled)  # the newest: a plan may count on it (prepare)
            if len(self._free) > self._keep_free:
                self._free.popleft()
            self._returned.notify_all()

    def has_free(self, fragment: int) -> bool:
        """Whether a capture of ``fragment`` now would reuse a buffer (a hint: another
        thread may take it)."""
        with self._returned:
            return self._fitting(self.fragments[fragment].layout.total) is not None

    def wait_for_free(self, fragment: int, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for a buffer a capture of ``fragment`` can reuse to
        come back encoded, if one is to come.

        A capture made when none is free allocates one more; where the training thread has
        nothing else to do (:meth:`gm_shell.pacer.Pacer.serve`) it waits instead, so that
        a burst of captures (every fragment's final delta at close) goes through the
        buffers of two, not one each (a copy of the whole model). Bounded: a capture
        dropped without being given back (a restart) never brings its buffer back."""
        size = self.fragments[fragment].layout.total
        with self._returned:
            self._returned.wait_for(
                lambda: self._fitting(size) is not None or not self._encoding, timeout_s
            )

    def recycle(self, taken: Taken) -> None:
        """``taken``'s buffer is free again (its delta was encoded); any thread may call."""
        if not taken.kept:
            with self._returned:
                self._encoding -= 1
            self._give_back(taken.theta)

    def _lend(self, count: int) -> None:
        """``count`` captures' buffers go to the loop, to come back encoded (:meth:`recycle`)."""
        with self._returned:
            self._encoding += count

    def forget(self, round_: int) -> None:
        """The snapshot of ``round_`` was never published: carry must not use its copy."""
        self._taken.pop(round_, None)

    def apply(
        self, round_: int, fragment: int, committed: F32, mode: Alignment, mixing: float
    ) -> None:
        """Fold ``committed`` into the model by ``mode``; it becomes the fragment's anchor."""
        access = self.fragments[fragment]
        anchor = self._anchors[fragment]
        kept = self._taken.pop(round_, None)
        if mode is Alignment.OVERWRITE or anchor is None:
            access.scatter(committed)
        else:
            snapshot = (anchor if kept is None else kept) if mode is Alignment.CARRY else None
            self._fold(access, committed, mode, mixing, snapshot)
        self._anchors[fragment] = access.held(committed)
        if kept is not None:  # the commit took our delta: the worker is done with this copy
            self._give_back(kept)
        for old in [r for r in self._taken if r <= round_]:
            del self._taken[old]

    def _fold(
        self,
        access: FragmentAccess,
        committed: F32,
        mode: Alignment,
        mixing: float,
        snapshot: F32 | None,
    ) -> None:
        """:func:`align` the parameters with ``committed``: in their own memory where numpy
        can write it and the tensors are big (the same operations element by element, no
        copy of the fragment; see :data:`IN_PLACE_SPAN`), else in a pooled buffer gathered
        from them and scattered back."""
        layout = access.layout
        big = layout.total >= IN_PLACE_SPAN * len(layout.spans)
        arrays = access.host_arrays() if big and isinstance(access, InPlace) else None
        if arrays is None:
            self._keep_free = POOLED + 1  # else each fold-in made and faulted in its own
            theta = self._buffer(layout.total)
            access.gather(theta)
            align(theta, committed, mode, mixing, snapshot)
            access.scatter(theta)
            self._give_back(theta)
            return
        for span, param in zip(layout.spans, arrays, strict=True):
            part = slice(span.start, span.stop)
            base = None if snapshot is None else snapshot[part]
            align(param, committed[part], mode, mixing, base)

    def copies(self) -> frozenset[int]:
        """The rounds whose snapshot copy is kept for carry (training thread)."""
        return frozenset(self._taken)

    def progress(self, fragment: int, base_round: int) -> F32:
        """θ of ``fragment`` minus its base: the copy kept for ``base_round``'s snapshot,
        or the anchor if ``base_round`` is -1 (a fresh array; see :mod:`gm_core.resume`)."""
        base = self._taken[base_round] if base_round >= 0 else self._anchors[fragment]
        assert base is not None, "progress is taken only after the join loaded the model"
        theta = self.read(fragment)
        return np.subtract(theta, base, out=theta)

    def add(self, fragment: int, progress: F32) -> None:
        """Lay saved local progress over the fragment as the model holds it (a restart)."""
        theta = self.read(fragment)
        self.fragments[fragment].scatter(np.add(theta, progress, out=theta))

    def overwrite_all(self, frontier: Sequence[F32]) -> None:
        """Every fragment takes the committed value (join, close, evaluation)."""
        for fragment, committed in enumerate(frontier):
            access = self.fragments[fragment]
            access.scatter(committed)
            self._anchors[fragment] = access.held(committed)
