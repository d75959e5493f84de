"""Numerics throughput next to memory-bound references, measured in one run.

Run: ``.venv/bin/python -m bench.bench_numerics [--mib 64] [--repeat 7] [--no-mlx]``

Every figure is bytes moved per second, counted as the minimum traffic an
operation needs (each input read once, each output written once):

* numpy copy: 2·N·4 bytes; torch axpy (``y += a·x``): 3·N·4 bytes;
* merge + Nesterov of k deltas: (k + 4)·N·4 bytes (k deltas read, Θ and m read and
  written);
* encode: N·4 fp32 bytes in; decode: N·4 fp32 bytes out; hash: bytes hashed.

Machines here are shared, so timings are interleaved round-robin across the
operations being compared and each keeps its best time; compare figures within
one run, not across runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

import blake3
import numpy as np
import torch

from gm_core.numerics import Contributions, Layout, wire_layout
from gm_core.records import Compression, MergeRule, WireFormat
from gm_shell.backends import Backend, NumpyBackend
from gm_shell.backends.torch_backend import TorchBackend
from gm_shell.payload import PayloadWriter, seal, write_fragment

Job = tuple[str, int, Callable[[], object]]


def interleaved(jobs: list[Job], repeat: int) -> dict[str, float]:
    """Best seconds of each job, running all jobs once per round."""
    best = {name: float("inf") for name, _, _ in jobs}
    for _ in range(repeat):
        for name, _, run in jobs:
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def table(title: str, jobs: list[Job], repeat: int, reference: float | None = None) -> float:
    """Print one section; return the first job's throughput (used as the reference)."""
    best = interleaved(jobs, repeat)
    print(f"\n{title}")
    print(f"  {'operation':<34} {'GB/s':>8} {'ms':>9}" + ("  vs axpy" if reference else ""))
    first = 0.0
    for name, nbytes, _ in jobs:
        rate = nbytes / best[name] / 1e9
        first = first or rate
        share = f"  {rate / reference:7.0%}" if reference else ""
        print(f"  {name:<34} {rate:8.2f} {best[name] * 1e3:9.1f}{share}")
    return first


def merge_jobs(
    backend: Backend[Any], label: str, n: int, ks: list[int], source: list[np.ndarray]
) -> list[Job]:
    layout = Layout.of([("fragment", (n,))])
    jobs: list[Job] = []
    theta, momentum = backend.asarray(source[0] * 0), backend.asarray(source[1] * 0)
    for k in ks:
        deltas = [backend.asarray(source[i]) for i in range(k)]
        c = Contributions(
            learners=tuple(f"learner-{i}" for i in range(k)),
            weights=tuple(float(i + 1) for i in range(k)),
        )

        def run(d: list[Any] = deltas, c: Contributions = c) -> None:
            backend.merge_step(d, c, layout, MergeRule.MEAN, "", theta, momentum, 0.7, 0.9)

        run()  # warm up (allocations, MLX compilation)
        jobs.append((f"{label} merge+nesterov k={k}", (k + 4) * n * 4, run))
    return jobs


def codec_jobs(backend: Backend[Any], label: str, x: np.ndarray) -> list[Job]:
    n = x.shape[0]
    layout = Layout.of([("fragment", (n,))])
    source, target = backend.asarray(x), backend.empty(n)
    jobs: list[Job] = []
    for fmt in WireFormat:
        wire = wire_layout(layout, fmt)
        codes, scales = np.empty(wire.code_bytes, np.uint8), np.empty(wire.scale_bytes, np.uint8)

        def enc(w: Any = wire, c: Any = codes, s: Any = scales) -> None:
            backend.encode(source, w, c, s)

        def dec(w: Any = wire, c: Any = codes, s: Any = scales) -> None:
            backend.decode(c, s, w, target)

        enc()
        jobs += [
            (f"{label} encode {fmt.value}", n * 4, enc),
            (f"{label} decode {fmt.value}", n * 4, dec),
        ]
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="fragment size in MiB of fp32")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-mlx", action="store_true")
    args = parser.parse_args()
    n = args.mib * (1 << 20) // 4
    rng = np.random.default_rng(0)
    source = [rng.standard_normal(n, dtype=np.float32) for _ in range(8)]
    threads = torch.get_num_threads()
    blas = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}
    print(f"fragment {args.mib} MiB fp32 ({n} elements); {os.cpu_count()} cpus")
    print(f"torch threads {threads}")
    print(f"torch {torch.__version__}, numpy {np.__version__}; OPENBLAS env: {blas or 'unset'}")

    x, y = torch.from_numpy(source[0]), torch.from_numpy(source[1].copy())
    copy_target = np.empty_like(source[0])
    references: list[Job] = [
        ("torch axpy (y += a*x)", 3 * n * 4, lambda: y.add_(x, alpha=0.5)),
        ("numpy copy", 2 * n * 4, lambda: np.copyto(copy_target, source[0])),
    ]
    ks = [1, 4, 8]
    merges = merge_jobs(TorchBackend(), "torch", n, ks, source)
    merges += merge_jobs(NumpyBackend(), "numpy", n, ks, source)
    if not args.no_mlx:
        from gm_shell.backends.mlx_backend import MlxBackend

        merges += merge_jobs(MlxBackend(), "mlx", n, ks, source)
    axpy = table("memory references and merges (interleaved)", references + merges, args.repeat)
    del merges

    codecs = codec_jobs(TorchBackend(), "torch", source[2])
    codecs += codec_jobs(NumpyBackend(), "numpy", source[2])
    table("wire codecs (fp32 side)", codecs, max(3, args.repeat // 2), reference=axpy)

    data = memoryview(source[3].tobytes())
    f32_wire = wire_layout(Layout.of([("fragment", (n,))]), WireFormat.F32)
    writer, torch_backend, fragment = PayloadWriter(), TorchBackend(), torch.from_numpy(source[4])
    file = write_fragment(writer, torch_backend, fragment, f32_wire)
    other: list[Job] = [
        ("blake3 (1 thread)", data.nbytes, lambda: blake3.blake3(data).digest()),
        (
            "blake3 (all threads)",
            data.nbytes,
            lambda: blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest(),
        ),
        ("sha256 (reference package)", data.nbytes, lambda: hashlib.sha256(data).digest()),
        (
            "write F32 payload (torch)",
            n * 4,
            lambda: write_fragment(writer, torch_backend, fragment, f32_wire),
        ),
        ("seal F32 payload (shuffle+zstd 3)", n * 4, lambda: seal(file, Compression.ZSTD)),
    ]
    table("hashing and payloads", other, max(3, args.repeat // 2), reference=axpy)


if __name__ == "__main__":
    main()
