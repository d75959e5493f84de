"""Round metrics from a session's events, to ``logging``, TensorBoard or Weights & Biases.

Theory of operation
-------------------
:func:`metrics_of` turns one event into the numbers worth plotting (the version
a commit made and how many learners it merged, the steps a snapshot carried,
the round a learner aligned with, a rejection by reason), each with the round
it belongs to, which is the x axis every sink uses: rounds are the run's clock,
the same on every node. A sink is an event callback (``Session(callbacks=[...])``)
that writes those numbers somewhere; like every callback it runs on the
session's event thread, never on the training loop's. TensorBoard and W&B are
imported when their sink is made, so this module needs neither.
"""

from __future__ import annotations

import logging
from typing import Any

from gm_shell import events
from gm_shell.extras import require

LOG = logging.getLogger("gm.metrics")


def metrics_of(event: events.Event) -> dict[str, float]:
    """The metrics one event carries (empty for events that carry none)."""
    if isinstance(event, events.Committed):
        return {"gm/version": event.version, "gm/participants": event.participants}
    if isinstance(event, events.Published):
        return {"gm/published_steps": event.steps}
    if isinstance(event, events.Aligned):
        return {"gm/aligned_round": event.round, "gm/aligned_version": event.version}
    if isinstance(event, events.Rejected):
        reason = event.reason.value if event.reason is not None else "unknown"
        return {f"gm/rejected/{reason}": 1}
    if isinstance(event, events.TookOver):
        return {"gm/took_over": 1}
    return {}


class LoggingMetrics:
    """Logs each event's metrics as one line on the ``gm.metrics`` logger (INFO)."""

    def __call__(self, event: events.Event) -> None:
        values = metrics_of(event)
        if values:
            pairs = " ".join(f"{k}={v:g}" for k, v in values.items())
            LOG.info("%s round %d %s", event.node, event.round, pairs)


class TensorBoardMetrics:
    """Writes each event's metrics as TensorBoard scalars at step = round.

    Args:
        log_dir: the folder of the event files (one per node is customary).
    """

    def __init__(self, log_dir: str) -> None:
        require("TensorBoardMetrics", ("tensorboard", "torch"), extra="tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def __call__(self, event: events.Event) -> None:
        for name, value in metrics_of(event).items():
            self.writer.add_scalar(name, value, global_step=max(event.round, 0))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbMetrics:
    """Logs each event's metrics to a Weights & Biases run, with the round as ``gm/round``.

    Args:
        run: a run from ``wandb.init(...)`` (``mode="offline"`` works without an account).
    """

    def __init__(self, run: Any) -> None:
        require("WandbMetrics", ("wandb",), extra="wandb")
        self.run = run
        run.define_metric("gm/*", step_metric="gm/round")

    def __call__(self, event: events.Event) -> None:
        values = metrics_of(event)
        if values:
            self.run.log({"gm/round": max(event.round, 0), **values})
