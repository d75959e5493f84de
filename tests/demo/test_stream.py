"""The token stream: a batch is a function of (seed, step, worker); DP sees the learners' tokens."""

from __future__ import annotations

import torch

from gm_shell.demo.spec import tiny
from gm_shell.demo.stream import TokenStream

CONFIG = tiny().data


def test_batches_are_reproducible_and_differ_across_workers_and_steps() -> None:
    a, b = TokenStream(CONFIG), TokenStream(CONFIG)
    assert torch.equal(a.batch(5, 1), b.batch(5, 1))
    assert not torch.equal(a.batch(5, 1), a.batch(5, 0))
    assert not torch.equal(a.batch(5, 1), a.batch(6, 1))
    assert a.batch(0, 0).shape == (CONFIG.batch, CONFIG.context + 1)


def test_data_parallel_batch_is_the_learners_batches_together() -> None:
    stream = TokenStream(CONFIG)
    together = stream.data_parallel_batch(3, workers=2)
    assert torch.equal(together, torch.cat([stream.batch(3, 0), stream.batch(3, 1)]))


def test_windows_are_contiguous_text() -> None:
    """Targets are the inputs shifted by one: each row is one span of the corpus."""
    stream = TokenStream(CONFIG)
    rows = stream.batch(0, 0)
    held_out = stream.eval_windows()
    assert held_out.shape == (CONFIG.eval_windows, CONFIG.context + 1)
    assert torch.equal(held_out, stream.eval_windows())
    assert int(rows.max()) < tiny().model.vocab
