"""The inner training step, shared by the gm learners and the data-parallel baseline.

Theory of operation
-------------------
Both sides of the comparison must differ only in how they synchronize, so they
share this one definition of an optimizer step: AdamW with a linear warmup and
cosine decay to a tenth of the peak, gradient clipping at norm 1. A gm learner
schedules by its own local step; the baseline by its global step; with equal
step counts the two schedules are identical.
"""

from __future__ import annotations

import math

import attrs
import torch
from torch import Tensor

from gm_shell.demo.charlm import CharLM, loss_of


@attrs.frozen(kw_only=True)
class InnerConfig:
    steps: int
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    clip: float = 1.0
    final_lr_fraction: float = 0.1

    def lr_at(self, step: int) -> float:
        """Linear warmup to ``lr``, then cosine decay to ``final_lr_fraction · lr``."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        floor = self.final_lr_fraction
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: CharLM, config: InnerConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norms, biases and position table are exempt)."""
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.pos_embed]
    rest = [p for p in model.parameters() if p.dim() < 2 or p is model.pos_embed]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


def train_step(
    model: CharLM, optimizer: torch.optim.Optimizer, config: InnerConfig, step: int, batch: Tensor
) -> float:
    """One optimizer step at schedule position ``step``; returns the batch loss (nats)."""
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(step)
    loss = loss_of(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
    optimizer.step()
    return float(loss.detach())
