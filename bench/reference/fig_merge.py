"""Figure 4, reference side: merge + outer step throughput on one fragment.

Reads the fragment and the contributions from an ``.npz`` written by ``bench/compare.py``
(so both sides see the same floats): ``names``, ``theta/<name>``, ``momentum/<name>``,
``delta<i>/<name>``, ``tokens``, ``steps``. Runs the reference's own outer step,
``DiLoCo(...).aggregator(...).close_round(state, contributions)``, over our numpy adapter:
it decodes the deltas, takes their Gram matrix (for the round's cosine), merges, applies
Nesterov and serializes the new theta and momentum. Best of ``--repeat`` runs; writes the
resulting theta and momentum to ``--out`` for compare.py to check against gm's. Prints JSON.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gradientmail import DiLoCo, Rda, WeightedMean
from gradientmail.algorithms import Contribution, FragmentState
from gradientmail.serialization import ParameterSpec, Schema
from numpy_adapter import NumpyBackend, from_f32, tensors_of, to_f32
from refkit import emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--merge", choices=("mean", "rda"), default="mean")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    data = np.load(args.inputs)
    names = [str(n) for n in data["names"]]
    tokens = [int(t) for t in data["tokens"]]
    steps = [int(s) for s in data["steps"]]
    k = len(tokens)
    schema = Schema(
        tuple(ParameterSpec(n, "F32", tuple(data[f"theta/{n}"].shape)) for n in sorted(names))
    )
    merge = WeightedMean() if args.merge == "mean" else Rda()
    algorithm = DiLoCo(sync_every=1, fragments=1, in_flight=1, merge=merge)
    aggregator = algorithm.aggregator(schema, names, NumpyBackend())
    state = FragmentState(
        version=1,
        theta=tensors_of({n: data[f"theta/{n}"] for n in names}),
        outer={f"momentum.{n}": from_f32(data[f"momentum/{n}"], "F32") for n in names},
    )
    contributions = [
        Contribution(
            learner=f"learner-{i}",
            local_step=steps[i],
            steps=steps[i],
            tokens=tokens[i],
            step_seconds=0.0,
            final=False,
            tensors=tensors_of({n: data[f"delta{i}/{n}"] for n in names}),
        )
        for i in range(k)
    ]
    elements = sum(int(data[f"theta/{n}"].size) for n in names)
    best = float("inf")
    result = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = aggregator.close_round(state, contributions)
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    np.savez(
        args.out,
        **{f"theta/{n}": to_f32(result.state.theta[n]) for n in names},
        **{f"momentum/{n}": to_f32(result.state.outer[f"momentum.{n}"]) for n in names},
    )
    emit(
        {
            "ok": True,
            "what": "DiLoCoAggregator.close_round (decode, Gram, merge, Nesterov, encode)",
            "merge": args.merge,
            "contributions": k,
            "elements": elements,
            "best_s": best,
            "delta_gb_per_s": k * elements * 4 / best / 1e9,
            "cosine": result.cosine,
        }
    )


if __name__ == "__main__":
    main()
