"""A Trainer node restarted with ``resume=True`` continues its data where its saved step left it.

A tiny GPT-2 (built from a config: nothing is downloaded) trains 12 steps over a
dataset of 5 batches, so the run crosses two epochs, with the sampler's seeded
shuffle. A plain Trainer trains all 12 steps once: the order every sample should
come in. With the gm callback, the node trains 6 steps and stops; a fresh Trainer
with the same node id resumes from ``callback.trainer_checkpoint(trainer)``. The
samples it trains on must be exactly the plain run's from step 7 on (epoch 1, after
its first batch), and its optimizer and step count go on from the save.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from gm_shell import DiLoCo, SessionOptions
from gm_shell.integrations.hf import GmTrainerCallback

STEPS, BATCH, SAMPLES, SEQUENCE = 12, 4, 20, 16
OPTIONS = SessionOptions(poll_s=0.05, renew_s=1.0, stall_timeout_s=120.0, join_timeout_s=120.0)
TOKENS = torch.randint(0, 64, (SAMPLES, SEQUENCE), generator=torch.Generator().manual_seed(1))
INDEX = {tuple(row.tolist()): i for i, row in enumerate(TOKENS)}
assert len(INDEX) == SAMPLES
DATA = [{"input_ids": t, "labels": t} for t in TOKENS]


class Recording(Trainer):  # type: ignore[misc]
    """A Trainer noting the samples of every batch it trains on, in order (its data loader
    reads ahead, so the dataset's reads are not what it trained)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trained: list[int] = []

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.trained += [INDEX[tuple(row.tolist())] for row in inputs["input_ids"]]
        return super().training_step(model, inputs, *args, **kwargs)


class StopAt(TrainerCallback):  # type: ignore[misc]
    """Stops the Trainer at ``step``; notes its step at the start and the session's count."""

    def __init__(self, step: int, gm: GmTrainerCallback | None) -> None:
        self.step, self.gm = step, gm
        self.began = self.counted = -1

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.gm is not None and self.gm.session is not None:
            self.counted = self.gm.session.step_count
        if state.global_step >= self.step:
            control.should_training_stop = True


def life(out: Path, stop: int, gm: GmTrainerCallback | None, resume: bool) -> tuple[Any, ...]:
    """One Trainer run: what it trained on, the step it began at and the session's count at
    its end, Adam's step at its end, the checkpoint folder it resumed from."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_positions=SEQUENCE,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    stopper = StopAt(stop, gm)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=7,
    )
    callbacks = [stopper] if gm is None else [gm, stopper]
    trainer = Recording(model=model, args=args, train_dataset=DATA, callbacks=callbacks)
    folder = gm.trainer_checkpoint(trainer) if gm is not None and resume else None
    trainer.train(resume_from_checkpoint=folder)
    adam = max(int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values())
    return trainer.trained, (stopper.began, stopper.counted), adam, folder


def node(url: str) -> GmTrainerCallback:
    algorithm = DiLoCo(sync_every=4, fragments=2, quorum=1)
    return GmTrainerCallback(algorithm, mailbox=url, node="n0", options=OPTIONS, resume=True)


def test_a_restarted_trainer_node_continues_the_data_order(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'run'}"
    plain, _, _, _ = life(tmp_path / "plain", STEPS, None, resume=False)
    assert len(plain) == STEPS * BATCH
    assert plain[:SAMPLES] != list(range(SAMPLES))  # shuffled, so skipping has to be right

    first = node(url)
    assert first.trainer_checkpoint(Trainer(model=torch.nn.Linear(1, 1))) is None  # no run yet
    drawn, began, adam, _ = life(tmp_path / "one", STEPS // 2, first, resume=True)
    assert (began, adam) == ((0, STEPS // 2), STEPS // 2)
    assert drawn == plain[: STEPS // 2 * BATCH]

    second = node(url)
    drawn, began, adam, folder = life(tmp_path / "two", STEPS, second, resume=True)
    assert folder is not None
    assert Path(folder).parent == tmp_path / "two"
    # The Trainer's step, from the folder and from the bucket, and the session's count.
    assert began == (STEPS // 2, STEPS)
    assert adam == STEPS  # Adam's moments went on from the save, not from zero
    assert drawn == plain[STEPS // 2 * BATCH :]
