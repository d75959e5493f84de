"""Evaluating gm's committed model while the run trains, from the bucket alone.

Theory of operation
-------------------
The model gm produces is the committed frontier in the bucket, so that is what
the plot shows: every ``period_s`` the launcher loads the newest commit with
``gm_shell.align`` (what a user's evaluation job would do: no lease, no writes)
and scores it on the held-out windows. Doing it here rather than in a learner
keeps the learners identical: a learner that also evaluates falls behind the
others, misses rounds and ends the run alone.

A commit's x position is the tokens trained by all learners when its round
was due (round ``r`` is due at local step ``step_of(r)`` of every learner). Reading
a run that is still being written can fail harmlessly — no manifest yet, or a
payload swept between reading a record and fetching it — and is retried at the
next period.
"""

from __future__ import annotations

import time

from gm_core.schedule import step_of
from gm_shell.align import align
from gm_shell.demo import charlm, layout
from gm_shell.demo.progress import Evaluated, ProgressWriter
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.mailbox import MailboxError
from gm_shell.run import RunError

COMMITTED = "committed"
"""The progress file of the committed model's evaluations."""


class CommittedEvaluator:
    def __init__(self, spec: DemoSpec, run: layout.RunDir, stream: TokenStream, period_s: float):
        self._spec = spec
        self._url = run.mailbox_url
        self._windows = stream.eval_windows()
        self._model = charlm.build(spec.model, spec.model_seed)
        self._out = ProgressWriter(run.progress(COMMITTED))
        self._period_s = period_s
        self._next_s = time.monotonic() + period_s
        self._round = -2

    def poll(self) -> None:
        """Evaluate the newest commit if a period has passed and it is new."""
        if time.monotonic() < self._next_s:
            return
        self._next_s = time.monotonic() + self._period_s
        try:
            checkpoint = align(self._model, mailbox=self._url)
        except (RunError, MailboxError, ValueError):
            return
        if checkpoint.round > self._round:
            self._round = checkpoint.round
            self._record(self._step_of(checkpoint.round))

    def _step_of(self, round_: int) -> int:
        """The learners' local step when ``round_`` was due: 0 for the initial parameters,
        at most the last step (later rounds hold only the learners' final flushes)."""
        gm = self._spec.gm
        due = 0 if round_ < 0 else step_of(round_, gm.sync_every, gm.fragments)
        return min(due, self._spec.steps)

    def final(self) -> float:
        """The newest commit's loss once every learner has closed (recorded at the last step)."""
        align(self._model, mailbox=self._url)
        return self._record(self._spec.steps)

    def _record(self, step: int) -> float:
        loss = charlm.eval_loss(self._model, self._windows)
        self._out.write(Evaluated(step=step, tokens=self._spec.tokens_at(step), loss=loss))
        return loss

    def close(self) -> None:
        self._out.close()
