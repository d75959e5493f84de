"""A learner's capture and align per fragment: this tree's adapter against an earlier one's.

Run: ``.venv/bin/python -m bench.bench_staging [--before REV] [--repeat 5] [--device cpu]``

The training thread's share of a round is one capture (``Replica.take``: the fragment's
parameters copied into a host buffer) and one align (``Replica.apply`` with carry: read,
fold the commit in, write back). Both go through ``gm_shell.models``; this measures them
with the adapter of this tree and with the one of git revision ``--before`` (its
``models.py`` loaded beside this one), alternately in one process, for fp32 and bf16
parameters and fragments of 1 and 16 MiB, and prints the median of each and the ratio
after/before. On CPU the change must cost nothing (``--before`` defaults to the commit
before the CUDA staging buffers).

With ``--device cuda`` the model lives on the GPU: the figures are then the staging
path's (one pinned transfer per fragment) against the earlier tensor-by-tensor copies,
and the host copy bandwidth (a pinned device-to-host copy of the same bytes) is printed
as the bound (``bench/device_check.sh``). ``--stage-before REV`` compares this tree with
the staging buffers of ``REV`` (the copies on the current stream, before the side
stream); ``--busy-ms`` queues that much matmul work on the current stream before each
align, as training has in flight, which an align's transfer on the side stream overlaps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from gm_core.records import Alignment, FragmentPlan
from gm_shell import models
from gm_shell.replica import Replica

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "9e2dd1a"
"""main before the CUDA staging buffers (issue 14 item 2)."""


def module_at(rev: str | None, name: str) -> ModuleType:
    """``gm_shell/{name}.py`` as of git revision ``rev`` (this tree's file: None), imported
    as ``{name}_before``."""
    path = ROOT / "src" / "gm_shell" / f"{name}.py"
    if rev is not None:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:src/gm_shell/{name}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        path = Path(tempfile.mkdtemp()) / f"{name}_before.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_before", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model(mib: int, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Four tensors making ``mib`` MiB of fp32 values."""
    n = mib * (1 << 20) // 4 // 4
    net = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for _ in range(4)])
    return net.to(device=device, dtype=dtype)


def timed(
    replica: Replica, committed: np.ndarray, repeat: int, sync: Any, busy: Any
) -> dict[str, float]:
    """Median seconds of a capture and of a carry align of fragment 0 (after ``busy()``
    queued training-like kernels on the current stream, on CUDA)."""
    takes, applies = [], []
    for r in range(repeat):
        t0 = time.perf_counter()
        taken = replica.take(r, 0, keep_copy=True)
        sync()
        t1 = time.perf_counter()
        busy()
        replica.apply(r, 0, committed, Alignment.CARRY, 1.0)
        sync()
        t2 = time.perf_counter()
        replica.recycle(taken)
        takes.append(t1 - t0)
        applies.append(t2 - t1)
    return {"capture_s": statistics.median(takes), "align_s": statistics.median(applies)}


def measure(
    module: ModuleType, net: torch.nn.Module, repeat: int, sync: Any, busy: Any
) -> dict[str, float]:
    adapter = module.TorchModel(net)
    replica = Replica(adapter, FragmentPlan(fragments=(tuple(t.name for t in adapter.schema()),)))
    values = replica.read(0)
    replica.overwrite_all([values])
    return timed(replica, values + 1e-3, repeat, sync, busy)


def busy_kernels(ms: float) -> Any:
    """A callable that queues about ``ms`` ms of matmuls on the current CUDA stream (what
    training has in flight when the training thread aligns); a no-op for 0."""
    if ms <= 0:
        return lambda: None
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    count = max(1, round(ms / ((time.perf_counter() - t0) * 100)))
    return lambda: [a @ a for _ in range(count)]


def host_copy_s(mib: int, repeat: int) -> float:
    """Seconds of a pinned device-to-host copy of ``mib`` MiB (the bound on CUDA)."""
    source = torch.empty(mib << 18, device="cuda")
    target = torch.empty(mib << 18, pin_memory=True)
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="git revision to compare with")
    parser.add_argument("--repeat", type=int, default=5, help="alternations of the two sides")
    parser.add_argument("--rounds", type=int, default=20, help="captures+aligns per side/turn")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default="1,16", help="fragment sizes in MiB")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument(
        "--stage-before",
        default=None,
        help="compare this tree's adapter with the CUDA staging (gm_shell/staging.py) of this "
        "git revision instead (--before is then unused)",
    )
    parser.add_argument(
        "--busy-ms", type=float, default=0.0, help="CUDA: kernels queued before each align"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.stage_before is None:
        before = module_at(args.before, "models")
    else:  # this tree's models.py over the earlier revision's staging buffers
        before = module_at(None, "models")
        before.CudaStage = module_at(args.stage_before, "staging").CudaStage  # type: ignore[attr-defined]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    busy = busy_kernels(args.busy_ms) if args.device == "cuda" else (lambda: None)
    what = args.before if args.stage_before is None else f"staging of {args.stage_before}"
    print(f"load {os.getloadavg()[0]:.1f}; before = {what}, after = this tree")
    rows = []
    for mib in [int(s) for s in args.sizes.split(",")]:
        for dtype in (torch.float32, torch.bfloat16):
            net = model(mib, dtype, args.device)
            sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for _ in range(args.repeat):
                for name, module in (("before", before), ("after", models)):
                    sides[name].append(measure(module, net, args.rounds, sync, busy))
            row: dict[str, Any] = {"mib": mib, "dtype": str(dtype).removeprefix("torch.")}
            for what in ("capture_s", "align_s"):
                for name in ("before", "after"):
                    row[f"{what}_{name}"] = statistics.median(s[what] for s in sides[name])
                row[f"{what}_ratio"] = row[f"{what}_after"] / row[f"{what}_before"]
            if args.device == "cuda":
                row["host_copy_s"] = host_copy_s(mib, args.rounds)
            rows.append(row)
            print(json.dumps(row))
    print(f"load {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
