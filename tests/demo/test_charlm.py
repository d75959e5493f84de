"""The character model: shapes, gradients, names gm relies on, and size."""

from __future__ import annotations

import torch

from gm_core.plan import block_index
from gm_shell.demo import charlm, corpus
from gm_shell.demo.spec import DemoSpec, tiny


def test_forward_gives_logits_per_position_and_backward_reaches_every_parameter() -> None:
    config = tiny().model
    model = charlm.build(config, seed=0)
    windows = torch.randint(0, config.vocab, (3, config.context + 1))
    assert model(windows[:, :-1]).shape == (3, config.context, config.vocab)
    loss = charlm.loss_of(model, windows)
    loss.backward()  # type: ignore[no-untyped-call]
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.shape == p.shape


def test_untrained_loss_is_near_uniform() -> None:
    config = tiny().model
    model = charlm.build(config, seed=0)
    windows = torch.randint(0, config.vocab, (8, config.context + 1))
    assert abs(charlm.eval_loss(model, windows) - corpus.uniform_entropy_nats()) < 0.1


def test_same_seed_same_parameters() -> None:
    a, b = (charlm.build(tiny().model, seed=3) for _ in range(2))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_names_place_blocks_and_embeddings_where_gm_expects() -> None:
    model = charlm.build(DemoSpec().model, seed=0)
    names = [n for n, _ in model.named_parameters()]
    blocks = {block_index(n) for n in names} - {None}
    assert blocks == set(range(DemoSpec().model.depth))
    assert {"token_embed.weight", "pos_embed"} <= set(names)


def test_demo_model_has_at_most_a_few_hundred_thousand_parameters() -> None:
    assert charlm.parameter_count(charlm.build(DemoSpec().model, seed=0)) < 300_000
