"""Figure 4, reference side: a closer's compute for one round, from payload bytes to payload bytes.

Reads the fragment and the contributions from an ``.npz`` written by ``bench/compare.py``
(so both sides see the same floats): ``names``, ``theta/<name>``, ``momentum/<name>``,
``delta<i>/<name>``, ``tokens``, ``steps``. Each delta is first packed as the payload a
learner uploads (untimed). Timed, the work the reference's closer does for a round between
fetching the snapshots' bytes and uploading the commit (``Exchange.fetch``, then
``close_round``, then ``Exchange.commit``'s payloads): for each delta its sha256 check,
``decode_payload`` and the schema check; then ``DiLoCo(...).aggregator(...).close_round``,
which loads the deltas, takes their Gram matrix (the round's cosine), merges, applies
Nesterov and turns theta and momentum into tensor bytes; then each of those packed as a
payload and hashed. The fragment's current theta and momentum are held in memory, as a
closer that committed the previous round holds them. Best of ``--repeat`` runs; writes the
resulting theta and momentum to ``--out`` for compare.py to check against gm's. Prints JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
from gradientmail import DiLoCo, Rda, WeightedMean
from gradientmail.algorithms import Contribution, FragmentState, layout
from gradientmail.compression import decode as decode_payload
from gradientmail.compression import encode as encode_payload
from gradientmail.serialization import ParameterSpec, Schema, validate
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
    blobs = [
        encode_payload(tensors_of({n: data[f"delta{i}/{n}"] for n in names}), "off")
        for i in range(k)
    ]
    digests = [hashlib.sha256(blob).hexdigest() for blob in blobs]
    deltas = layout(schema, algorithm.delta_dtype)

    def close_round() -> tuple[object, list[bytes]]:
        contributions = []
        for i, (blob, digest) in enumerate(zip(blobs, digests, strict=True)):
            assert hashlib.sha256(blob).hexdigest() == digest
            tensors = decode_payload(blob, "off")
            validate(deltas, tensors, names)
            contributions.append(
                Contribution(
                    learner=f"learner-{i}",
                    local_step=steps[i],
                    steps=steps[i],
                    tokens=tokens[i],
                    step_seconds=0.0,
                    final=False,
                    tensors=tensors,
                )
            )
        result = aggregator.close_round(state, contributions)
        payloads = [
            encode_payload(result.state.theta, "off"),
            encode_payload(result.state.outer, "off"),
        ]
        for payload in payloads:
            hashlib.sha256(payload).hexdigest()
        return result, payloads

    elements = sum(int(data[f"theta/{n}"].size) for n in names)
    best = float("inf")
    result = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result, _payloads = close_round()
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
            "what": "sha256 + decode of each delta payload, close_round (Gram, merge, "
            "Nesterov), theta and momentum payloads packed + sha256",
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
