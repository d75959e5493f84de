"""A closer's round on its torch device against the host path it replaced, in one process.

Run: ``nice -n 10 .venv/bin/python -m bench.bench_closer_device [--mib 16] [--repeat 7]
[--formats F32,BF16,F8_E4M3,F4_E2M1] [--device cpu|cuda]``

From the delta payloads' bytes to theta's and momentum's payload bytes, as
``gm_shell.runtime`` calls the codec on each path, for ``--contributions`` deltas of one
fragment of ``--mib`` MiB, mean merge:

- ``numpy``: the host path of a numpy closer (unchanged by the device path);
- ``torch, host decode``: deltas decoded and judged by numpy on the host, merged by torch
  (copied to its device), encoded on the host: a torch closer on CPU (before issue 14's
  device decode, and again since, :func:`gm_shell.fragments.on_accelerator`);
- ``torch, on device``: a torch closer on an accelerator
  (:attr:`gm_shell.fragments.FragmentCodec.device`): deltas decoded and judged on torch's
  device, merged there, encoded there, theta brought home once. Measured on CPU too
  (called directly), which is how the CPU rule was chosen.

The three paths run interleaved, ``--repeat`` times after one warm-up, on the same
payloads; the two torch paths' thetas are compared bit for bit. On CUDA each path's time
ends with its theta on the host (the device is waited for there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gm_core.numerics import Contributions
from gm_core.records import AlgorithmConfig, TensorSpec, WireFormat
from gm_shell.backends import backend
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.run import draft_manifest


def codecs(mib: int, wire: WireFormat, device: str) -> tuple[FragmentCodec, FragmentCodec]:
    """A numpy codec and a torch one on ``device`` for one fragment of four tensors."""
    n = mib * (1 << 20) // 4
    rows = n // 4 // 512
    shapes = [(rows, 512)] * 3 + [(n - 3 * rows * 512,)]
    schema = tuple(TensorSpec(name=f"t{i}", shape=s, dtype="F32") for i, s in enumerate(shapes))
    config = AlgorithmConfig(
        sync_every=1, fragments=1, in_flight=1, delta_format=wire, commit_format=wire
    )
    manifest = draft_manifest(run_id="bench", node="closer", config=config, schema=schema)
    return FragmentCodec(manifest), FragmentCodec(manifest, backend("torch", device=device))


def paths(host: FragmentCodec, torch_codec: FragmentCodec, k: int) -> dict[str, Callable[[], Any]]:
    """Each path's round, from the same payloads and base to the host theta."""
    rng = np.random.default_rng(0)
    total = host.layouts[0].total
    theta = rng.standard_normal(total, dtype=np.float32)
    momentum = rng.standard_normal(total, dtype=np.float32) * np.float32(0.01)
    payloads = [
        host.encode(0, Role.DELTA, 1, rng.standard_normal(total, dtype=np.float32) * 0.01)
        for _ in range(k)
    ]
    who = Contributions(learners=tuple(f"n{i}" for i in range(k)), weights=(1.0 / k,) * k)
    device = torch_codec.compute  # the device path, even on CPU where the runtime skips it
    momentum_there = device.asarray(momentum.copy())

    def on_host(codec: FragmentCodec) -> Any:
        deltas = [codec.load(0, Role.DELTA, ref, data) for data, ref in payloads]
        merged = codec.merge(0, theta, momentum, deltas, who)
        data, _ = codec.encode(0, Role.THETA, 2, merged.theta)
        codec.encode(0, Role.MOMENTUM, 2, merged.momentum)
        return codec.roundtrip(0, Role.THETA, merged.theta, data)

    def on_device() -> Any:
        deltas = [torch_codec.load(0, Role.DELTA, ref, data, device) for data, ref in payloads]
        merged = torch_codec.merge_on(device, 0, theta, momentum_there, deltas, who)
        data, _ = torch_codec.encode(0, Role.THETA, 2, merged.theta, device)
        torch_codec.encode(0, Role.MOMENTUM, 2, merged.momentum, device)
        return torch_codec.brought_home(0, Role.THETA, merged.theta, data, device)

    return {
        "numpy": lambda: on_host(host),
        "torch, host decode": lambda: on_host(torch_codec),
        "torch, on device": on_device,
    }


def measure(mib: int, wire: WireFormat, device: str, k: int, repeat: int) -> dict[str, Any]:
    host, torch_codec = codecs(mib, wire, device)
    runs = paths(host, torch_codec, k)
    results = {name: run() for name, run in runs.items()}  # warm-up; the thetas compared
    same = results["torch, host decode"].tobytes() == results["torch, on device"].tobytes()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    delta_bytes = k * host.layouts[0].total * 4
    print(f"{wire.value}: {mib} MiB x {k} deltas, mean, torch on {device}; {repeat} repeats")
    print(f"  the torch paths' thetas are the same bit for bit: {same}")
    figures: dict[str, Any] = {"same_theta": same}
    for name, ts in times.items():
        best, median = min(ts), statistics.median(ts)
        print(
            f"  {name:20s} best {best * 1e3:8.1f} ms  median {median * 1e3:8.1f} ms"
            f"  ({delta_bytes / best / 1e9:.2f} GB/s of deltas at best)"
        )
        figures[name] = {"best_s": best, "median_s": median}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--contributions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--formats", default="F32,BF16,F8_E4M3,F4_E2M1")
    parser.add_argument("--device", default="cpu", help="torch's device: cpu, cuda, mps")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    out = {
        wire: measure(args.mib, WireFormat(wire), args.device, args.contributions, args.repeat)
        for wire in args.formats.split(",")
    }
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
