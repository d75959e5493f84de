"""One node of an integration test run: ``python integration_worker.py KIND URL NODE STEPS``.

KIND is ``hf`` (a transformers Trainer on a tiny GPT-2 built from a config) or
``lightning`` (a Lightning Trainer on a small regression module). Both train on
data made here, download nothing, and join the run at URL through the gm
callback; the process prints ``done <node> <round>`` when the Trainer returns.
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


def hf(url: str, node: str, steps: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

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
    callback = GmTrainerCallback(algorithm, mailbox=url, node=node, options=OPTIONS)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    return callback.session


def lightning(url: str, node: str, steps: int) -> Any:
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
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(steps * BATCH, 8)
    data = torch.utils.data.TensorDataset(x, x @ torch.ones(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    callback = GmCallback(ALGORITHM, mailbox=url, node=node, options=OPTIONS)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(Regression(), loader)
    return callback.session


if __name__ == "__main__":
    kind, url, node, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    session = {"hf": hf, "lightning": lightning}[kind](url, node, steps)
    print(f"done {node} {session.checkpoint.round}", flush=True)
