"""A torch + MLX + JAX run against a torch-only run of the same size (issue 14, Show).

    .venv/bin/python -m bench.bench_frameworks --repeats 4

Runs ``examples/three_frameworks.py`` with ``--frameworks torch,mlx,jax`` and with
``--frameworks torch,torch,torch`` alternately (same steps, H and seeds: three learners
each), ``--repeats`` times each, and prints the committed model's error on held-out
inputs (the example's figure, read through a torch model) per run and per setting: the
mixed run converges when its errors lie within the spread of the torch-only ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "three_frameworks.py"
SETTINGS = ("torch,mlx,jax", "torch,torch,torch")


def run(frameworks: str, steps: int, sync_every: int, seed: int) -> dict[str, object]:
    argv = [sys.executable, str(EXAMPLE), "--frameworks", frameworks, "--json"]
    argv += ["--steps", str(steps), "--sync-every", str(sync_every), "--seed", str(seed)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--sync-every", type=int, default=40)
    args = parser.parse_args()
    errors: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for repeat in range(args.repeats):
        for setting in SETTINGS:
            figures = run(setting, args.steps, args.sync_every, seed=10 * repeat)
            mse = float(figures["committed_mse_torch"])  # type: ignore[arg-type]
            errors[setting].append(mse)
            print(f"{setting:18s} repeat {repeat}: mse {mse:.5f} round {figures['round']}")
    for setting, values in errors.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(
            f"{setting:18s} mse mean {statistics.mean(values):.5f} sd {spread:.5f} "
            f"min {min(values):.5f} max {max(values):.5f} (n={len(values)})"
        )


if __name__ == "__main__":
    main()
