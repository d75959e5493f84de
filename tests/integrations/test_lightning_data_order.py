"""A Lightning node restarted with ``resume=True`` continues its data where its saved step left it.

A small regression module trains 15 optimizer steps over a dataset of 5 batches,
so the run crosses two epoch boundaries. Its loader is ``torchdata``'s
``StatefulDataLoader`` (a loader with ``state_dict()``, which Lightning resumes
within an epoch) over its ``StatefulDistributedSampler``, whose shuffled order is
a function of the epoch (``set_epoch``, which Lightning calls) drawn when the
first batch is. A plain Trainer trains all 12 steps once:
the order every sample should come in. With the gm callback, the node stops at
step 6 (in epoch 1, after its first batch) cleanly (``fit`` returns; the session
closes and saves), or raises out of its loop as a preempted node would stop, once
a boundary save after step 0 is in the bucket (no closing save then: it resumes
from that save and trains the steps after it again; and it must have released its
lease already). A fresh Trainer, module and loader with the same node id must then
train on exactly the plain run's samples from the step after the save on, with
the Trainer's step and Adam's going on from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from gm_core import keys
from gm_shell import DiLoCo, SessionOptions
from gm_shell.integrations.lightning import GmCallback
from gm_shell.resume import read_saved

STEPS, BATCH, SAMPLES = 15, 4, 20
OPTIONS = SessionOptions(
    poll_s=0.05,
    renew_s=1.0,
    stall_timeout_s=120.0,
    join_timeout_s=120.0,
    resume_every_rounds=1,  # a save after each commit folded in (the crash resumes from one)
)


class Regression(pl.LightningModule):
    """A linear regression noting the samples of every batch it trains on, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)
        self.trained: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        index, x, y = batch
        self.trained += index.tolist()
        return torch.nn.functional.mse_loss(self.fc(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class PreemptedError(Exception):
    """What stops a node by an exception out of its training loop."""


class StopAt(pl.Callback):
    """Stops the Trainer at ``step`` by ``should_stop``, or (``crash``) by raising
    :class:`PreemptedError` at the first step from ``step`` on where the node's resume state in
    the bucket is from after step 0; notes the Trainer's step when fitting starts and the
    session's count after each batch (both after gm's callback)."""

    def __init__(self, step: int, gm: GmCallback | None, crash: bool) -> None:
        self.step, self.gm, self.crash = step, gm, crash
        self.began = self.counted = -1

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.began = trainer.global_step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.gm is not None and self.gm.session is not None:
            self.counted = self.gm.session.step_count
        if trainer.global_step >= self.step:
            if not self.crash:
                trainer.should_stop = True
            elif self.gm is not None and _saved_step(self.gm) > 0:
                raise PreemptedError


def _saved_step(gm: GmCallback) -> int:
    saved = read_saved(gm.mailbox, "n0")
    return -1 if saved is None else saved.step


def life(stop: int, gm: GmCallback | None, crash: bool = False) -> tuple[list[int], int, int, int]:
    """One fit: what it trained on, the Trainer's step when it began, the session's step
    count and Adam's step at its end."""
    torch.manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(torch.arange(SAMPLES), x, x @ torch.ones(8, 1))
    sampler = StatefulDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=7)
    loader = StatefulDataLoader(data, batch_size=BATCH, sampler=sampler)
    stopper = StopAt(stop, gm, crash)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[stopper] if gm is None else [gm, stopper],
    )
    module = Regression()
    if crash:
        with pytest.raises(PreemptedError):
            trainer.fit(module, loader)
    else:
        trainer.fit(module, loader)
    adam = max(int(s["step"]) for s in trainer.optimizers[0].state_dict()["state"].values())
    return module.trained, stopper.began, stopper.counted, adam


def node(url: str) -> GmCallback:
    algorithm = DiLoCo(sync_every=4, fragments=2, quorum=1)
    return GmCallback(algorithm, mailbox=url, node="n0", options=OPTIONS, resume=True)


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "raised"])
def test_a_restarted_lightning_node_continues_the_data_order(crash: bool, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'run'}"
    plain, _, _, _ = life(STEPS, None)
    assert len(plain) == STEPS * BATCH
    epochs = [plain[i : i + SAMPLES] for i in range(0, SAMPLES * 2, SAMPLES)]
    assert epochs[0] != list(range(SAMPLES))  # shuffled...
    assert epochs[0] != epochs[1]  # ... and by epoch

    half = STEPS // 2
    drawn, began, counted, adam = life(half, node(url), crash)
    stopped = len(drawn) // BATCH  # half, or later when raised (after a boundary save)
    assert (began, counted, adam) == (0, stopped, stopped)
    assert drawn == plain[: stopped * BATCH]
    assert stopped == half if not crash else half <= stopped < STEPS
    # Raised out of fit: the lease is gone already (peers do not wait a lease timeout).
    assert not (tmp_path / "run" / keys.lease("n0")).exists()

    drawn, began, counted, adam = life(STEPS, node(url))
    # Stopped, it goes on from the closing save (step 6); raised, from its last boundary
    # save: the batches after that save are trained again, in the same order.
    assert began == half if not crash else 0 < began <= stopped
    assert counted == STEPS  # the session's count went on from the save's
    assert adam == STEPS  # Adam's moments went on from the save, not from zero
    assert drawn == plain[began * BATCH :]
