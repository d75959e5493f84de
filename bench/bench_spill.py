"""What spilling a closer's deltas costs in time and saves in memory (:mod:`gm_shell.spill`).

Run: ``.venv/bin/python -m bench.bench_spill [--mib 16] [--learners 4] [--rounds 8] [--repeat 3]``

Each run is a fresh process that does a closer's part of ``--rounds`` rounds on one
fragment of ``--mib`` MiB over a ``file://`` mailbox, bare f32 payloads (gm's default),
through the code a node runs: the round's ``--learners`` deltas (uploaded before the
first round) read and judged by a :class:`gm_shell.reads.Reader` as a closer's ``Verify``
reads them, all at once, then merged with the momentum into a new theta
(:meth:`~gm_shell.fragments.FragmentCodec.merge_held`, the compute backend ``auto``
picks: torch on CPU here, numpy for spilled deltas) and the new theta and momentum
encoded. ``spill``: the reader spills every delta (``Spill(above=0)``, into the system's
temporary directory); ``memory``: it holds them (``spill_above`` None). The two alternate
in processes of their own (``--repeat`` each), so a change of load falls on both, with
glibc's mmap threshold fixed at 1 MiB (``SessionOptions.mmap_threshold``, as the memory
tests' nodes run: a freed buffer leaves the process at once). Printed
for each: the median time of a round's reads and of its merge and encodes, and the
resident memory's growth to its peak from the first round's start, in MiB and fragments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_memory import one_fragment_codec, status_kib

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
MODES = ("spill", "memory")


async def one_run(mode: str, mib: float, learners: int, rounds: int) -> dict[str, Any]:
    """A closer's reads and merges of ``rounds`` rounds in this process; its figures."""
    import numpy as np

    from gm_core.numerics import Contributions
    from gm_core.records import Compression
    from gm_shell.allocator import fix_mmap_threshold
    from gm_shell.fragments import Role
    from gm_shell.mailbox import Mailbox
    from gm_shell.reads import Reader
    from gm_shell.spill import Spill

    fix_mmap_threshold(MiB)  # as the memory tests' nodes run: freed buffers leave at once
    codec, n = one_fragment_codec(mib, Compression.NONE)
    rng = np.random.default_rng(0)
    names = tuple(f"l{i}" for i in range(learners))
    contributions = Contributions(learners=names, weights=(1.0 / learners,) * learners)
    theta = rng.normal(size=n).astype(np.float32)
    momentum: Any = None
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as tmp:
        mailbox = Mailbox.open(f"file://{tmp}/bucket")
        refs = []
        for r in range(rounds):
            deltas = [rng.normal(size=n).astype(np.float32) * 1e-3 for _ in names]
            encoded = [await asyncio.to_thread(codec.encode, 0, Role.DELTA, r, d) for d in deltas]
            for data, ref in encoded:
                await mailbox.put_once(ref.key, data)
            refs.append([ref for _, ref in encoded])
            del deltas, encoded

        def step(r: int, theta: Any, momentum: Any, held: list[Any]) -> tuple[Any, Any]:
            """A worker's part of a round, as a closer's: merge, then encode what it made."""
            merged = codec.merge_held(0, theta, momentum, held, contributions, handed_over=True)
            held.clear()
            data, _ = codec.encode(0, Role.THETA, r, merged.theta)
            theta = codec.brought_home(0, Role.THETA, merged.theta, data, codec.device)
            mdata, mref = codec.encode(0, Role.MOMENTUM, r, merged.momentum)
            return theta, codec.load(0, Role.MOMENTUM, mref, mdata)

        async def compute(fn: Any, *args: Any) -> Any:
            return await loop.run_in_executor(None, fn, *args)

        reader = Reader(
            node="n0", mailbox=mailbox, codec=codec, compute=compute, emit=lambda _: None,
            clock=time.monotonic, spill=Spill(above=0) if mode == "spill" else None,
        )  # fmt: skip
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # the peak from here
        start = status_kib("VmRSS")
        reads, merges = [], []
        for r in range(rounds):
            began = time.perf_counter()
            held = list(
                await asyncio.gather(*(reader.payload(0, Role.DELTA, ref) for ref in refs[r]))
            )
            read = time.perf_counter()
            theta, momentum = await asyncio.to_thread(step, r, theta, momentum, held)
            reads.append(read - began)
            merges.append(time.perf_counter() - read)
        await mailbox.aclose()
    return {
        "mode": mode,
        "peak_growth": (status_kib("VmHWM") - start) / 1024,
        "reads": reads[1:],  # the first round warms the codecs up
        "merges": merges[1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16, help="the fragment's size")
    parser.add_argument("--learners", type=int, default=4, help="deltas a round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode, alternately")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    if args.one:
        run = one_run(args.one, args.mib, args.learners, args.rounds)
        print(json.dumps(asyncio.run(run)))
        return
    print(
        f"load {os.getloadavg()[0]:.2f}; fragment {args.mib} MiB, {args.learners} deltas a"
        f" round, {args.rounds} rounds, spill directory {tempfile.gettempdir()}"
    )
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode in MODES:
            cmd = [sys.executable, "-m", "bench.bench_spill", "--one", mode, "--mib", str(args.mib)]
            cmd += ["--learners", str(args.learners), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout))
    for mode, results in runs.items():
        reads = [t for r in results for t in r["reads"]]
        merges = [t for r in results for t in r["merges"]]
        peak = [r["peak_growth"] for r in results]
        print(
            f"{mode:>6}: reads median {statistics.median(reads) * 1e3:.0f} ms, merge and encodes"
            f" median {statistics.median(merges) * 1e3:.0f} ms; growth to peak"
            f" {min(peak):.0f}-{max(peak):.0f} MiB"
            f" ({min(peak) / args.mib:.1f}-{max(peak) / args.mib:.1f} fragments)"
        )
    print(f"load {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
