"""``Session`` for a group learner: the leader's session and its followers' (:mod:`gm_shell.group`).

:class:`Session` makes one of these when it is given a process group of several ranks
(or detects one, :func:`gm_shell.group.resolve`); a single process never sees this class.
Every method keeps the single learner's meaning; what changes is who does what: the
leader (group rank 0) runs the session and wraps each of its collective points (entering,
a check step, closing) in a :class:`~gm_shell.group.Link` command stream that ends with
``DONE`` or ``FAIL``; a follower counts steps and follows that stream at the same points.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gm_shell import group as groups
from gm_shell.models import ModelAdapter
from gm_shell.queue import Consumer, SharedQueue
from gm_shell.resume import capture, restore
from gm_shell.session import Role, Session


class GroupSession(Session):
    """A :class:`Session` whose learner is a process group (see :mod:`gm_shell.group`)."""

    def __init__(self, model: Any = None, *, group: Any = groups.AUTO, **kwargs: Any) -> None:
        super().__init__(model, group=None, **kwargs)
        process_group = groups.resolve(group, model)
        assert process_group is not None, "Session makes a GroupSession only for a group"
        if self.role not in (Role.BOTH, Role.LEARNER):
            raise ValueError(f"a group trains one learner: role {self.role} takes no group")
        if self._resume is not None and groups.sharded(model):
            raise ValueError(
                "resume= is not supported for sharded parameters (FSDP2): each rank's "
                "optimizer state is a shard of its own"
            )
        self._link = groups.Link(process_group)
        self._group_model: groups.GroupModel | None = None
        self._next_check = 0
        self._count = 0
        """A follower's steps (the leader's are its pacer's)."""
        self._done = groups.Done(next_check=0, round=-1, divergences=0, rank=-1)

    @property
    def leads(self) -> bool:
        """Whether this rank is the group's leader (rank 0), the node in the bucket."""
        return self._link.leads

    def _adapt(self) -> ModelAdapter | None:
        if self._group_model is None:
            self._group_model = groups.GroupModel(
                self._model, self.algorithm.sync_filter, self._link
            )
        return self._group_model

    def _lead(self, action: Callable[[], None]) -> None:
        """Do ``action`` on the leader with its followers following; end the check."""
        try:
            action()
        except BaseException as error:
            self._link.fail(error)
            raise
        pacer = self._pacer
        step = 0 if pacer is None else pacer.step
        self._next_check = step + 1 if pacer is None else max(pacer.barrier, step + 1)
        runtime = self._runtime
        self._link.done(
            groups.Done(
                next_check=self._next_check,
                round=self.round,
                divergences=0 if runtime is None else runtime.divergences,
                rank=-1 if self.rank is None else self.rank,
            )
        )

    def _follow(self) -> None:
        assert self._group_model is not None
        done = groups.follow(self._link, self._group_model, self._resumed)
        changed = done.divergences != self._done.divergences
        if changed and done.divergences > 0 and self._on_diverged is not None:
            self._on_diverged()  # the leader reloaded: every rank resets its optimizer
        self._done = done
        self._next_check = done.next_check

    def _start_resume(self, manifest: Any) -> None:
        """The leader restores (or first saves) the group's state as a single learner does,
        then hands it to its followers: replicated (DDP) ranks hold the same optimizer
        state, and count steps from the same saved step."""
        super()._start_resume(manifest)
        if self._resume is not None:
            self._link.send(groups.Op.RESUMED)
            self._link.objects((self._step_base, capture(self._resume)))

    def _resumed(self, step: int, values: dict[str, Any]) -> None:
        """A follower takes the leader's restored state (see :meth:`_start_resume`)."""
        if self._resume is not None:
            restore(self._resume, values)
        self._step_base = step

    def start(self) -> None:
        if self.leads:
            if self._pacer is None:  # not started: the leader's own joining, then DONE
                self._lead(super().start)
            return
        self._adapt()
        self._follow()

    def step(self, samples: int | None = None, *, tokens: int | None = None) -> None:
        if not self.leads:
            self._count += 1
            if self._count >= self._next_check:
                self._follow()
            return
        pacer = self._pacer
        if pacer is None:
            raise RuntimeError("step() needs a started session with a learner role")
        if pacer.step + 1 < self._next_check:
            count = tokens if self._counts_tokens else samples
            pacer.tokens += self._missing_count(samples, tokens) if count is None else count
            pacer.step += 1
            return
        self._lead(lambda: Session.step(self, samples, tokens=tokens))

    def _make_runtime(self, manifest: Any) -> Any:
        runtime = super()._make_runtime(manifest)
        if runtime.pacer is not None:
            runtime.pacer.waiting = self._link.heartbeat  # a stall keeps the followers live
        return runtime

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.leads:
                self._lead(super().close)
                self._link.objects(self.checkpoint)
                return
            try:
                self._follow()
                self.checkpoint = self._link.objects()
            finally:
                self._teardown()
        finally:
            self._link.release()

    def run(
        self, step: Callable[[Any], int | None], data: Iterable[Any] | SharedQueue[Any]
    ) -> None:
        """:meth:`Session.run` on every rank, each over its own data, as many batches on
        every rank (as DDP and FSDP need anyway): the leader marks the group's data done
        (``done/{node}.json``, or its rank's marker) and looks whether the run is finished
        while its followers wait in :meth:`close`. With a :class:`SharedQueue` the group is
        one node of it: the leader claims each unit and names it to its followers, and
        every rank trains ``data.load`` of that unit's value."""
        if self.leads:
            try:
                super().run(step, data)
            except BaseException as error:
                self._link.fail(error)  # followers waiting for a unit (once told, a no-op)
                raise
            return
        try:
            if isinstance(data, SharedQueue):
                while (index := groups.next_unit(self._link)) >= 0:
                    self._train(step, data.load(data.values[data.units[index]]))
            else:
                self._train(step, data)
        except BaseException:
            self._leave()
            raise
        self.close()

    def _want(self, consumer: Consumer, data: SharedQueue[Any]) -> Any:
        unit = self._link.waiting(lambda: Session._want(self, consumer, data))
        self._link.send(groups.Op.UNIT, -1 if unit is None else data.units.index(unit.unit))
        return unit

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        if self.leads:
            with super().pause():
                yield
        else:
            yield

    @property
    def step_count(self) -> int:
        return super().step_count if self.leads else self._step_base + self._count

    @property
    def round(self) -> int:
        return super().round if self.leads else self._done.round

    @property
    def rank(self) -> int | None:
        if self.leads:
            return super().rank
        return None if self._done.rank < 0 else self._done.rank
