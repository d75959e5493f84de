"""The token stream: which windows of the corpus each worker trains on at each step.

Theory of operation
-------------------
The comparison "gm vs data-parallel at equal tokens" is only fair if both see
the *same* tokens. So a batch is a pure function of ``(seed, step, worker)``:
learner ``k`` of a gm run trains at its local step ``t`` on
``batch(t, k)``, and data-parallel step ``t`` over ``M`` simulated workers
trains on ``batch(t, 0) … batch(t, M−1)`` together. Windows start at random
offsets of the training text, drawn from a numpy generator seeded by the triple,
so no process needs to agree with another about anything but the seed.

Held-out windows come from a text generated with a different seed and are fixed
once (evenly spaced), so every evaluation of every model scores the same text.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
from torch import Tensor

from gm_shell.demo import corpus


@attrs.frozen(kw_only=True)
class DataConfig:
    seed: int = 0
    train_chars: int = 1_000_000
    eval_chars: int = 200_000
    eval_windows: int = 128
    context: int = 64
    batch: int = 16
    """Windows per worker per step."""

    @property
    def tokens_per_batch(self) -> int:
        """Tokens one worker trains on per step (predicted characters)."""
        return self.batch * self.context


def _as_tensor(ids: corpus.Ids) -> Tensor:
    return torch.from_numpy(ids.astype(np.int64))


class TokenStream:
    """Training batches and held-out windows of one seeded corpus."""

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self._train = _as_tensor(corpus.encode(corpus.generate(config.seed, config.train_chars)))
        held_out = corpus.encode(corpus.generate(config.seed + 1, config.eval_chars))
        self._held_out = _as_tensor(held_out)

    def batch(self, step: int, worker: int) -> Tensor:
        """Windows of shape (batch, context + 1) for ``worker`` at ``step``."""
        cfg = self.config
        rng = np.random.default_rng((cfg.seed, step, worker))
        starts = rng.integers(0, self._train.shape[0] - cfg.context - 1, size=cfg.batch)
        return self._windows(self._train, starts)

    def data_parallel_batch(self, step: int, workers: int) -> Tensor:
        """What ``workers`` simulated data-parallel workers train on together at ``step``."""
        return torch.cat([self.batch(step, k) for k in range(workers)])

    def unigram_nats(self) -> float:
        """Unigram entropy of the held-out text: the loss floor of a context-blind model."""
        return corpus.unigram_entropy_nats(self._held_out.numpy().astype(np.uint8))

    def eval_windows(self) -> Tensor:
        """Evenly spaced held-out windows of shape (eval_windows, context + 1)."""
        cfg = self.config
        last = self._held_out.shape[0] - cfg.context - 1
        starts = np.linspace(0, last, cfg.eval_windows).astype(np.int64)
        return self._windows(self._held_out, starts)

    def _windows(self, ids: Tensor, starts: np.ndarray[tuple[int], np.dtype[np.int64]]) -> Tensor:
        span = torch.arange(self.config.context + 1)
        return ids[torch.from_numpy(starts)[:, None] + span]
