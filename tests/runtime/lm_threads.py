"""Sessions of real transformers models trained on threads of this process (see lm_worker)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from lm_worker import BATCH, batch, loss_of

from gm_shell import Session, SessionOptions

FAST = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=10.0, stall_timeout_s=60.0, join_timeout_s=60.0
)


def train_together(
    sessions: list[Session], models: list[Any], steps: int, lr: float = 1e-2
) -> list[list[float]]:
    """Start every session (in order, on this thread), train them on threads, close them."""
    for session in sessions:
        session.start()
    losses: list[list[float]] = [[] for _ in sessions]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(sessions))

    def node(i: int) -> None:
        try:
            model, session = models[i], sessions[i]
            rng = np.random.default_rng(i)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
            for _ in range(steps):
                loss = loss_of(model, batch(rng))
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses[i].append(float(loss.item()))
                session.step(samples=BATCH)
            barrier.wait(timeout=120)  # nobody closes while the others still need a closer
            session.close()
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(len(sessions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    if errors:
        raise errors[0]
    return losses
