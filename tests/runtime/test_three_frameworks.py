"""A torch, an MLX and a JAX learner train one model together, and it converges.

The three processes build the same two-layer network (same parameter names, shapes
and dtypes) in their own framework (the JAX one in flax nnx, trained by optax), so
the run's schema is one. Afterwards the committed model is loaded with
``gm_shell.align`` into a fresh model of each framework: all three predict the same,
and far better than at the start.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from runtime_harness import file_run, make_harness, wait_until
from runtime_worker import IN, TEACHER, jax_model, mlx_model, torch_model
from test_chaos import started

import gm_shell


def mse_torch(model: object, x: np.ndarray) -> float:
    import torch

    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()  # type: ignore[operator]
    return float(np.mean((y - x @ TEACHER) ** 2))


def mse_mlx(model: object, x: np.ndarray) -> float:
    import mlx.core as mx

    y = np.array(model(mx.array(x)))  # type: ignore[operator]
    return float(np.mean((y - x @ TEACHER) ** 2))


def mse_jax(model: object, x: np.ndarray) -> float:
    y = np.asarray(model(x))  # type: ignore[operator]
    return float(np.mean((y - x @ TEACHER) ** 2))


def test_torch_mlx_and_jax_learners_share_a_run_and_converge(tmp_path: Path) -> None:
    url, options = file_run(tmp_path)
    h = make_harness(url, options, tmp_path, quorum=2)
    others = ("mlx-node", "jax-node")
    try:
        h.spawn("torch-node", seed=0, framework="torch")
        wait_until("the run to exist", lambda: started(h, "torch-node"), 60)
        h.spawn("mlx-node", seed=1, framework="mlx", steps=600)
        h.spawn("jax-node", seed=2, framework="jax", steps=600)
        wait_until(
            "the MLX and JAX learners to finish",
            lambda: not any(h.nodes[n].alive for n in others),
            180,
        )
        codes = h.stop("torch-node")
        for name in others:
            assert h.nodes[name].process.exitcode == 0, h.log(name)
    finally:
        h.close()
    assert codes == {"torch-node": 0}, h.log("torch-node")
    for name in ("torch-node", *others):
        result = h.result(name)
        assert np.mean(result["losses"]) < 0.25 * np.mean(result["first_losses"]), (name, result)

    x = np.random.default_rng(99).normal(size=(256, IN)).astype(np.float32)
    fresh_torch, _ = torch_model(seed=7)
    fresh_mlx, _ = mlx_model(seed=8)
    fresh_jax, _ = jax_model(seed=9)
    before = mse_torch(fresh_torch, x)
    checkpoint = gm_shell.align(fresh_torch, mailbox=url, options=options)
    assert gm_shell.align(fresh_mlx, mailbox=url, options=options) == checkpoint
    assert gm_shell.align(fresh_jax, mailbox=url, options=options) == checkpoint
    after_torch = mse_torch(fresh_torch, x)
    assert after_torch < 0.1 * before, (before, after_torch)
    for after in (mse_mlx(fresh_mlx, x), mse_jax(fresh_jax, x)):
        assert abs(after_torch - after) <= 1e-4 * max(after_torch, 1e-6), (after_torch, after)
    participants = {p for r in range(checkpoint.round) for p in participants_of(url, r)}
    assert participants == {"torch-node", *others}


def participants_of(url: str, round_: int) -> set[str]:
    path = Path(url.removeprefix("file://")) / f"rounds/{round_:012d}.json"
    return {p["learner"] for p in json.loads(path.read_text())["participants"]}
