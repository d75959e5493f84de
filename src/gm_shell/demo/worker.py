"""The training loop every demo worker runs: steps, progress lines, periodic evaluation.

Theory of operation
-------------------
A gm learner and the data-parallel baseline run the same loop and differ in
two hooks: which batch a step trains on, and what happens after the optimizer
step (a learner calls ``Session.step``; the baseline does nothing). Keeping one
loop keeps the comparison honest: same schedule, same evaluation cadence, same
tokens axis (tokens trained by all ``M`` workers together, so a gm learner at
step ``t`` and the baseline at step ``t`` sit at the same x).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch
from torch import Tensor

from gm_shell.demo.charlm import CharLM, eval_loss
from gm_shell.demo.progress import Evaluated, ProgressWriter, Trained
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.training import train_step

REPORT_EVERY = 10
"""Steps between progress lines: often enough for a live display, rare enough to be free."""


@attrs.frozen(kw_only=True)
class Hooks:
    batch_of: Callable[[int], Tensor]
    """The windows to train on at a step."""
    after_step: Callable[[int], None] = lambda step: None
    """Called with the number of steps done, after each optimizer step."""
    eval_windows: Tensor | None = None
    """Held-out windows to evaluate on every ``eval_every`` steps; None: never."""
    round_of: Callable[[], int] = lambda: -1
    """The newest round folded into the model, for progress lines (-1: none, or no gm)."""


@attrs.frozen(kw_only=True)
class Totals:
    steps: int
    compute_s: float
    """Seconds inside forward, backward and optimizer steps (evaluation excluded)."""


def evaluate(
    spec: DemoSpec, model: CharLM, windows: Tensor, step: int, out: ProgressWriter
) -> None:
    out.write(Evaluated(step=step, tokens=spec.tokens_at(step), loss=eval_loss(model, windows)))


def train(
    spec: DemoSpec,
    model: CharLM,
    optimizer: torch.optim.Optimizer,
    hooks: Hooks,
    out: ProgressWriter,
) -> Totals:
    """Run ``spec.steps`` optimizer steps with the shared schedule; report as it goes.

    The optimizer comes ready-made: building the first one imports torch's
    compiler stack, seconds of work that must not happen while a gm session is
    open and its peers wait for this learner's first snapshot.
    """
    start = time.perf_counter()
    compute_s = 0.0
    if hooks.eval_windows is not None:
        evaluate(spec, model, hooks.eval_windows, 0, out)
    for step in range(spec.steps):
        batch = hooks.batch_of(step)
        t0 = time.perf_counter()
        loss = train_step(model, optimizer, spec.inner, step, batch)
        compute_s += time.perf_counter() - t0
        done = step + 1
        hooks.after_step(done)
        if done % REPORT_EVERY == 0 or done == spec.steps:
            out.write(
                Trained(
                    step=done,
                    loss=loss,
                    elapsed_s=time.perf_counter() - start,
                    round=hooks.round_of(),
                )
            )
        if hooks.eval_windows is not None and (done % spec.eval_every == 0 or done == spec.steps):
            evaluate(spec, model, hooks.eval_windows, done, out)
    return Totals(steps=spec.steps, compute_s=compute_s)


def single_thread() -> None:
    """One intra-op thread per process: the demo runs several processes on few cores,
    and oversubscribed torch thread pools would spend the cores spinning."""
    torch.set_num_threads(1)
