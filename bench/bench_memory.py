"""Where a closer's memory goes on big fragments, and what the allocator setting costs.

Run: ``.venv/bin/python -m bench.bench_memory [--mib 16] [--rounds 12] [--repeat 3]``

Each run is a fresh process that does a closer's payload work on one fragment of
``--mib`` MiB (zstd, f32), ``--rounds`` times, as :mod:`gm_shell.runtime` does it: two
deltas decoded from their bytes (a new pair every round), the momentum decoded, the
merge (the compute backend ``auto`` picks: torch on CPU here), the new theta and
momentum encoded, the theta brought home for the commit cache; the newest theta and
momentum stay held between rounds (the caches), everything else is dropped. It prints
the resident memory's growth from the first round's start to the peak (VmHWM) and at the
end, in MiB and in fragments, and the median and p90 time of a round (and its median
CPU time, all threads: steadier than the wall clock on a loaded machine).

Three settings of the C allocator, in alternate processes (``--repeat`` each, so a change
of load falls on all): ``glibc`` as it comes (its mmap threshold rises to the biggest
buffer freed, so later fragments come from the heap and stay resident, fragmented),
``trim`` (the same, with ``malloc_trim(0)`` after every round: free heap pages given back),
and ``fixed`` (:func:`gm_shell.allocator.fix_mmap_threshold` at 1 MiB, as a ``Session``
with ``mmap_threshold=1 << 20`` does: every fragment-sized buffer is its own mapping, gone
when freed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
SETTINGS = ("glibc", "trim", "fixed")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def one_run(setting: str, mib: int, rounds: int) -> dict[str, Any]:
    """A closer's payload work in this process; its figures."""
    import numpy as np

    from gm_core import plan
    from gm_core.numerics import Contributions
    from gm_core.records import AlgorithmConfig, Compression, Manifest, TensorSpec
    from gm_shell.allocator import _glibc, fix_mmap_threshold
    from gm_shell.fragments import FragmentCodec, Role, compute_backend

    if setting == "fixed":
        assert fix_mmap_threshold(MiB)
    n = mib * MiB // 4
    schema = (TensorSpec(name="w", shape=(n,), dtype="F32"),)
    cfg = AlgorithmConfig(sync_every=8, fragments=1, compression=Compression.ZSTD)
    manifest = Manifest(
        run_id="r", created_by="n0", config=cfg, schema=schema,
        plan=plan.make_plan(schema, cfg), init=(),
    )  # fmt: skip
    codec = FragmentCodec(manifest, compute_backend("auto"))
    rng = np.random.default_rng(0)
    contributions = Contributions(learners=("a", "b"), weights=(0.5, 0.5))
    theta = rng.normal(size=n).astype(np.float32)
    momentum: Any = None
    payloads = [
        [codec.encode(0, Role.DELTA, r, rng.normal(size=n).astype(np.float32) * 1e-3) for _ in "ab"]
        for r in range(rounds)
    ]
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak from here
    start = _status_kib("VmRSS")
    times = []
    cpu = []
    for r in range(rounds):
        began = time.perf_counter()
        began_cpu = time.process_time()
        deltas = [codec.load(0, Role.DELTA, ref, data) for data, ref in payloads[r]]
        merged = codec.merge_held(0, theta, momentum, deltas, contributions)
        data, _ = codec.encode(0, Role.THETA, r, merged.theta)
        theta = codec.brought_home(0, Role.THETA, merged.theta, data, codec.device)
        mdata, mref = codec.encode(0, Role.MOMENTUM, r, merged.momentum)
        momentum = codec.load(0, Role.MOMENTUM, mref, mdata)
        del deltas, merged, data, mdata
        if setting == "trim":
            libc = _glibc()
            assert libc is not None
            libc.malloc_trim(0)
        times.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
    return {
        "setting": setting,
        "peak_growth": (_status_kib("VmHWM") - start) / 1024,
        "end_growth": (_status_kib("VmRSS") - start) / 1024,
        "times": times[1:],  # the first round warms the codecs up
        "cpu": cpu[1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16, help="the fragment's size")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each setting, alternately")
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.mib, args.rounds)))
        return
    print(f"load {os.getloadavg()[0]:.2f}; fragment {args.mib} MiB, {args.rounds} rounds")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    for _ in range(args.repeat):
        for setting in SETTINGS:
            cmd = [sys.executable, "-m", "bench.bench_memory", "--one", setting]
            cmd += ["--mib", str(args.mib), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(out.stdout))
    for setting, results in runs.items():
        times = sorted(t for r in results for t in r["times"])
        cpu = sorted(t for r in results for t in r["cpu"])
        peak = [r["peak_growth"] for r in results]
        end = [r["end_growth"] for r in results]
        print(
            f"{setting:>6}: growth to peak {min(peak):.0f}-{max(peak):.0f} MiB"
            f" ({min(peak) / args.mib:.1f}-{max(peak) / args.mib:.1f} fragments), at the end"
            f" {min(end):.0f}-{max(end):.0f} MiB; round median"
            f" {statistics.median(times) * 1e3:.0f} ms,"
            f" p90 {times[int(0.9 * len(times))] * 1e3:.0f} ms"
            f" (CPU time median {statistics.median(cpu) * 1e3:.0f} ms)"
        )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
