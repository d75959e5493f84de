"""The closer's numerics on a CUDA device against the device's own copy bandwidth.

Run (on a CUDA machine; ``bench/device_check.sh`` runs it): ``.venv/bin/python -m
bench.bench_device [--mib 256] [--repeat 7]``

``compute="auto"`` merges on the CUDA device when there is one (issue 14 item 2). The
figures are bytes moved per second, counted as in :mod:`bench.bench_numerics` (merge +
Nesterov of k deltas: (k + 4)·N·4 bytes), next to a device-to-device copy of the same
fragment (2·N·4 bytes), the bound; the goal is at least half of it. Codecs (fp32 side)
and the host transfers a learner's capture and align make (pinned, one fragment) are
printed too. Every job synchronizes the device before its clock stops.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch

from bench.bench_numerics import Job, codec_jobs, merge_jobs, table
from gm_shell.backends.torch_backend import TorchBackend


def synced(jobs: list[Job]) -> list[Job]:
    """The jobs, each waiting for the device before it returns."""

    def wait(run: Callable[[], object]) -> Callable[[], object]:
        return lambda: (run(), torch.cuda.synchronize())

    return [(name, nbytes, wait(run)) for name, nbytes, run in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="fragment size in MiB of fp32")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "bench_device needs a CUDA device"
    n = args.mib * (1 << 20) // 4
    rng = np.random.default_rng(0)
    source = [rng.standard_normal(n, dtype=np.float32) for _ in range(8)]
    print(
        f"{torch.cuda.get_device_name()}; fragment {args.mib} MiB fp32; torch {torch.__version__}"
    )
    a, b = torch.from_numpy(source[0]).cuda(), torch.empty(n, device="cuda")
    pinned = torch.from_numpy(source[1]).pin_memory()
    references: list[Job] = [
        ("device copy", 2 * n * 4, lambda: b.copy_(a)),
        ("host->device (pinned)", n * 4, lambda: b.copy_(pinned, non_blocking=True)),
        ("device->host (pinned)", n * 4, lambda: pinned.copy_(a, non_blocking=True)),
    ]
    device = TorchBackend(device="cuda")
    merges = merge_jobs(device, "cuda", n, [1, 4, 8], source)
    copy = table("device copy vs merges (interleaved)", synced(references + merges), args.repeat)
    print(f"\n(the goal: merge+nesterov at >= 50% of the device copy's {copy:.1f} GB/s)")
    del merges
    table("wire codecs on the device", synced(codec_jobs(device, "cuda", source[2])), 3, copy)


if __name__ == "__main__":
    main()
