"""A torch, an MLX and a JAX learner train one model together (CPU, a local folder).

    python examples/three_frameworks.py
    python examples/three_frameworks.py --frameworks torch,torch,torch   # torch alone, to compare

Starts one process per framework (``torch_learner.py``, ``mlx_learner.py``,
``jax_learner.py`` beside this file) on one mailbox; they start training together
(``--parties``: a barrier in the bucket, as each imports its framework in its own
time) and the launcher waits for them to finish, then
loads the run's committed parameters into a fresh model of each framework
(``gm_shell.align``) and prints its error on held-out inputs against the teacher all
three learn. The three models predict the same: one run, one model, three frameworks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import gm_shell

HERE = Path(__file__).resolve().parent
SCRIPTS = {"torch": "torch_learner.py", "mlx": "mlx_learner.py", "jax": "jax_learner.py"}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default="torch,mlx,jax", help="one learner each")
    parser.add_argument("--mailbox", default=None, help="the run's URL (default: a new folder)")
    parser.add_argument("--steps", type=int, default=600, help="steps of every learner")
    parser.add_argument("--sync-every", type=int, default=40, help="H: steps per cycle")
    parser.add_argument("--seed", type=int, default=0, help="learner i gets seed + i")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON line (with each learner's printed losses and "
        "the round each framework's model was aligned to)",
    )
    return parser.parse_args()


def train(
    frameworks: list[str], url: str, steps: int, sync_every: int, seed: int
) -> dict[str, str]:
    """Every learner's output by node id, once all have exited (status 0, else SystemExit)."""
    nodes = {}
    for i, framework in enumerate(frameworks):
        argv = [sys.executable, str(HERE / SCRIPTS[framework]), "--mailbox", url]
        argv += ["--node", f"{framework}-{i}", "--steps", str(steps)]
        argv += ["--sync-every", str(sync_every), "--parties", str(len(frameworks))]
        argv += ["--seed", str(seed + i)] if framework != "mlx" else []
        nodes[f"{framework}-{i}"] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    outputs = {name: node.communicate()[0] for name, node in nodes.items()}
    for name, node in nodes.items():
        if node.returncode != 0:
            raise SystemExit(f"{name} exited {node.returncode}:\n{outputs[name][-3000:]}")
    return outputs


def losses(node: str, output: str) -> list[float]:
    """The losses a learner printed (``{node} step {n}: loss {value} ...``), first to last."""
    prefix = f"{node} step "
    return [
        float(line.split(": loss ")[1].split()[0])
        for line in output.splitlines()
        if line.startswith(prefix) and ": loss " in line
    ]


def fresh_models(frameworks: set[str]) -> dict[str, tuple[Any, Any]]:
    """A fresh model of each framework and its prediction function (numpy in, numpy out)."""
    sys.path.insert(0, str(HERE))
    models: dict[str, tuple[Any, Any]] = {}
    if "torch" in frameworks:
        import torch
        import torch_learner

        net = torch_learner.Net()

        def torch_predict(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return net(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]

        models["torch"] = (net, torch_predict)
    if "mlx" in frameworks:
        import mlx.core as mx
        import mlx_learner

        mlx_net = mlx_learner.Net()
        models["mlx"] = (mlx_net, lambda x: np.array(mlx_net(mx.array(x))))
    if "jax" in frameworks:
        import jax_learner
        from flax import nnx

        jax_net = jax_learner.Net(nnx.Rngs(1))
        models["jax"] = (jax_net, lambda x: np.asarray(jax_net(x)))
    return models


def main() -> None:
    args = arguments()
    frameworks = args.frameworks.split(",")
    url = args.mailbox or f"file://{tempfile.mkdtemp(prefix='gm-three-')}"
    outputs = train(frameworks, url, args.steps, args.sync_every, args.seed)
    x = np.random.default_rng(99).normal(size=(1024, 16)).astype("f4")
    y = x @ np.random.default_rng(0).normal(size=(16, 1)).astype("f4")  # the learners' teacher
    figures: dict[str, Any] = {"frameworks": frameworks, "steps": args.steps, "url": url}
    figures["losses"] = {node: losses(node, out) for node, out in outputs.items()}
    figures["rounds"] = {}
    for framework, (model, predict) in fresh_models(set(frameworks)).items():
        figures[f"untrained_mse_{framework}"] = float(np.mean((predict(x) - y) ** 2))
        figures["round"] = figures["rounds"][framework] = gm_shell.align(model, mailbox=url).round
        figures[f"committed_mse_{framework}"] = float(np.mean((predict(x) - y) ** 2))
    if args.json:
        print(json.dumps(figures))
        return
    for out in outputs.values():
        print("\n".join(line for line in out.splitlines() if " step " in line or "final" in line))
    print(f"committed model (round {figures['round']}) on held-out inputs:")
    for framework in sorted(set(frameworks)):
        before, after = figures[f"untrained_mse_{framework}"], figures[f"committed_mse_{framework}"]
        print(f"  {framework:5s} mse {after:.5f} (untrained {before:.3f})")


if __name__ == "__main__":
    main()
