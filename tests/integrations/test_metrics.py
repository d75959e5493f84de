"""Round metrics from a real run's events reach logging, TensorBoard and W&B (offline)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from gm_shell import DiLoCo, Session, SessionOptions, events
from gm_shell.integrations.metrics import (
    LoggingMetrics,
    TensorBoardMetrics,
    WandbMetrics,
    metrics_of,
)

FAST = SessionOptions(poll_s=0.02, renew_s=0.5, stall_timeout_s=60.0, join_timeout_s=60.0)


def train(url: str, callbacks: list[events.Callback], steps: int = 24) -> list[events.Event]:
    """One learner-and-closer node trains ``steps`` steps; every event it saw, in order."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    seen: list[events.Event] = []
    algo = DiLoCo(sync_every=4, fragments=2)
    with Session(
        model,
        algorithm=algo,
        mailbox=url,
        node="m0",
        options=FAST,
        callbacks=[*callbacks, seen.append],
    ) as s:
        rng = np.random.default_rng(0)
        for _ in range(steps):
            x = torch.from_numpy(rng.normal(size=(8, 4)).astype("f4"))
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            s.step(samples=8)
    return seen


def test_metrics_go_to_logging_tensorboard_and_wandb(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="gm-test", dir=str(tmp_path), mode="offline")
    board = TensorBoardMetrics(str(tmp_path / "tb"))
    with caplog.at_level(logging.INFO, logger="gm.metrics"):
        seen = train(f"file://{tmp_path / 'run'}", [LoggingMetrics(), board, WandbMetrics(run)])
    board.close()
    commits = [e for e in seen if isinstance(e, events.Committed)]
    assert commits, "the run committed rounds"

    logged = [r.getMessage() for r in caplog.records if r.name == "gm.metrics"]
    for c in commits:
        assert (
            f"m0 round {c.round} gm/version={c.version} gm/participants={c.participants}" in logged
        )

    tb = EventAccumulator(str(tmp_path / "tb"))
    tb.Reload()
    versions = [(s.step, s.value) for s in tb.Scalars("gm/version")]
    assert versions == [(c.round, float(c.version)) for c in commits]

    assert run.summary["gm/version"] == commits[-1].version
    assert run.summary["gm/round"] == max(e.round for e in seen if metrics_of(e))
    run.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
