"""A learner with a torch optimizer, an LR warm-up and a data position that it resumes:
``python resume_worker.py SPEC_JSON`` (see test_resume.py).

It trains until ``Session.step_count`` reaches ``steps``, drawing batch ``n`` from a
generator seeded with ``n`` (so the data position alone decides the data), and
appends to ``log``, one JSON line each: on entering the session what it restored
(step, data position, learning rate, a digest of the optimizer's state), the
model's loss on a fixed evaluation batch, the round it holds and the loss of that
round's commit alone (what a restart without local progress would start from);
then after every step the same with the model's loss. The test kills it (SIGKILL)
and starts it again with the same node id; with ``die_after_save`` it kills itself
as soon as it finds, in the bucket (``file://``), a resume state saved at that step
or later with its local progress.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from runtime_worker import IN, TEACHER, torch_model

from gm_core import keys
from gm_shell import DiLoCo, Session, SessionOptions, align
from gm_shell.resume import decode


def digest(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's per-parameter state (moments and step counts), as a hash."""
    h = hashlib.sha256()
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        for name, value in sorted(state.items()):
            h.update(f"{index}.{name}".encode())
            h.update(value.detach().reshape(-1).to(torch.float64).numpy().tobytes())
    return h.hexdigest()


class SaveWatch:
    """Finds a resume state with local progress saved at ``step`` or later in the bucket."""

    def __init__(self, url: str, node: str, step: int) -> None:
        self.folder = Path(url.removeprefix("file://"))
        self.node, self.step = node, step
        self.seen = -1

    def landed(self) -> bool:
        path = self.folder / keys.resume(self.node)
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            return False
        if stamp == self.seen:
            return False
        self.seen = stamp
        run = json.loads((self.folder / keys.manifest()).read_text())["run_id"]
        saved = decode(path.read_bytes(), run=run, node=self.node, key=keys.resume(self.node))
        return saved.progress is not None and saved.step >= self.step


def main(spec: dict[str, Any]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    model, _ = torch_model(seed=spec["seed"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    state: dict[str, Any] = {"optimizer": optimizer, "scheduler": warmup, "data": 0}
    log = Path(spec["log"]).open("a", buffering=1)  # noqa: SIM115 (open until the process dies)
    held_out = torch.from_numpy(np.random.default_rng(-1 % 2**32).normal(size=(512, IN)))
    held_out = held_out.to(torch.float32)
    teacher = torch.from_numpy(TEACHER)
    die = spec.get("die_after_save")
    watch = SaveWatch(spec["url"], spec["node"], die) if die is not None else None

    def evaluate(net: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(((net(held_out) - held_out @ teacher) ** 2).mean())

    def write(**fields: Any) -> None:
        fields.update(lr=warmup.get_last_lr()[0], opt=digest(optimizer), data=state["data"])
        log.write(json.dumps(fields) + "\n")

    with Session(
        model,
        algorithm=DiLoCo(**spec["algorithm"]),
        mailbox=spec["url"],
        node=spec["node"],
        options=SessionOptions(**spec["options"]),
        resume=state,
    ) as session:
        commit, _ = torch_model(seed=spec["seed"])
        align(commit, mailbox=spec["url"], round=session.round if session.round >= 0 else None)
        entered = {"step": session.step_count, "loss": evaluate(model), "round": session.round}
        write(entered=True, commit_loss=evaluate(commit), **entered)
        while session.step_count < spec["steps"]:
            rng = np.random.default_rng(state["data"])
            x = torch.from_numpy(rng.normal(size=(32, IN)).astype(np.float32))
            loss = ((model(x) - x @ teacher) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            warmup.step()
            state["data"] += 1
            session.step(samples=32)
            write(step=session.step_count, loss=evaluate(model))
            if watch is not None and watch.landed():
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(spec["sleep_s"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
