"""One node of an integration test run: ``integration_worker.py KIND URL NODE STEPS [resume]``.

KIND is ``hf`` (a transformers Trainer on a tiny GPT-2 built from a config) or
``lightning`` (a Lightning Trainer on a small regression module). Both train on
data made here, download nothing, and join the run at URL through the gm
callback; the process prints ``done <node> <round>`` when the Trainer returns.
With ``resume`` the callback resumes the node (``resume=True``), the Lightning
run counts tokens, and the process also prints ``resumed`` with the Trainer's
step when training began, the optimizer steps it took, and where its step
count, optimizer and LR schedule ended.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs
import torch

from gm_shell import DiLoCo, SessionOptions

ALGORITHM = DiLoCo(sync_every=4, fragments=2, quorum=2, lease_timeout_s=5.0, takeover_floor_s=5.0)
SEQUENCE = 16
"""Tokens per sample of the Trainer's GPT-2, whose run counts tokens (Lightning's, samples)."""
OPTIONS = SessionOptions(poll_s=0.05, renew_s=1.0, stall_timeout_s=120.0, join_timeout_s=120.0)
BATCH = 4


def report(seen: list[tuple[int, int]], optimizer: Any, scheduler: Any) -> None:
    """What a resumed node did: ``resumed BEGAN TAKEN STEP_COUNT ADAM_STEP SCHEDULE``, from
    the Trainer's step and ``Session.step_count`` seen when training began and after each
    step."""
    adam = max(int(s["step"]) for s in optimizer.state_dict()["state"].values())
    began, counted = seen[0][0], seen[-1][1]
    print(f"resumed {began} {len(seen) - 1} {counted} {adam} {scheduler.last_epoch}")


def hf(url: str, node: str, steps: int, resume: bool) -> Any:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from gm_shell.integrations.hf import GmTrainerCallback

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=SEQUENCE, n_embd=16, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    shape = (steps * BATCH, SEQUENCE)
    tokens = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir=f"/tmp/gm-hf-{node}",
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        include_num_input_tokens_seen=True,
    )
    algorithm = attrs.evolve(ALGORITHM, unit="tokens")
    callback = GmTrainerCallback(algorithm, mailbox=url, node=node, options=OPTIONS, resume=resume)
    seen: list[tuple[int, int]] = []

    class Watch(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.append((state.global_step, callback.session.step_count))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.append((state.global_step, callback.session.step_count))

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback, Watch()])
    trainer.train()
    if resume:
        report(seen, trainer.optimizer, trainer.lr_scheduler)
    return callback.session


def lightning(url: str, node: str, steps: int, resume: bool) -> Any:
    import lightning.pytorch as pl

    from gm_shell.integrations.lightning import GmCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.fc(x), y)

        def configure_optimizers(self) -> Any:
            if not resume:
                return torch.optim.SGD(self.parameters(), lr=0.05)
            adam = torch.optim.Adam(self.parameters(), lr=0.01)
            schedule = torch.optim.lr_scheduler.LambdaLR(adam, lambda k: 1 / (1 + k))
            return {"optimizer": adam, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    seen: list[tuple[int, int]] = []

    class Watch(pl.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append((trainer.global_step, callback.session.step_count))

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append((trainer.global_step, callback.session.step_count))

    torch.manual_seed(0)
    x = torch.randn(steps * BATCH, 8)
    data = torch.utils.data.TensorDataset(x, x @ torch.ones(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    algorithm = attrs.evolve(ALGORITHM, unit="tokens") if resume else ALGORITHM
    callback = GmCallback(algorithm, mailbox=url, node=node, options=OPTIONS, resume=resume)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, Watch()],
    )
    trainer.fit(Regression(), loader)
    if resume:
        report(seen, trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler)
    return callback.session


if __name__ == "__main__":
    kind, url, node, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    resume = sys.argv[5:] == ["resume"]
    torch.set_num_threads(1)
    session = {"hf": hf, "lightning": lightning}[kind](url, node, steps, resume)
    print(f"done {node} {session.checkpoint.round}", flush=True)
