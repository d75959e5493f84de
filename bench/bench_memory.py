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

``--live``: where a live node's memory goes. Two nodes in processes of their own, as
``tests/runtime/test_hostile_bucket.py`` runs them (a closer-learner ``n0`` and a learner
``n1``, quorum 2, 16 steps per cycle, ``file://``), train a model of ``--mib`` MiB for
``--rounds`` commits: ``--layers`` square layers of equal size between two small ones, in
as many fragments (at least two; with one layer, the default, a fragment is the whole
model); ``--no-spill``: the closer holds the deltas it merges in memory, whatever their
size (``SessionOptions.spill_above`` None, :mod:`gm_shell.spill`; ``--spill-above``: from
that many MiB). Each node samples its resident memory every few milliseconds from its
session's start; at each new high it notes what is live then: the C allocator's bytes in
use (``mallinfo2``: heap and mapped) against its free heap, what tracemalloc sees (Python
objects and numpy's buffers; ``--trace`` only, it slows the node) grouped by the gm
function that allocated each buffer of 1 MiB or more, and torch's parameters and
gradients (which tracemalloc does not see).
It prints each node's growth to the peak (VmHWM) and that table at the highest sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
SETTINGS = ("glibc", "trim", "fixed")
BIG = 1 << 20
"""Live buffers of this size or more are attributed one by one (``--live --trace``)."""


def status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def one_fragment_codec(mib: float, compression: Any) -> tuple[Any, int]:
    """A closer's codec for a run of one tensor of ``mib`` MiB in one fragment, and its size."""
    from gm_core import plan
    from gm_core.records import AlgorithmConfig, Manifest, TensorSpec
    from gm_shell.fragments import FragmentCodec, compute_backend

    n = int(mib * MiB) // 4
    schema = (TensorSpec(name="w", shape=(n,), dtype="F32"),)
    cfg = AlgorithmConfig(sync_every=8, fragments=1, compression=compression)
    manifest = Manifest(
        run_id="r", created_by="n0", config=cfg, schema=schema,
        plan=plan.make_plan(schema, cfg), init=(),
    )  # fmt: skip
    return FragmentCodec(manifest, compute_backend("auto")), n


def one_run(setting: str, mib: float, rounds: int) -> dict[str, Any]:
    """A closer's payload work in this process; its figures."""
    import numpy as np

    from gm_core.numerics import Contributions
    from gm_core.records import Compression
    from gm_shell.allocator import _glibc, fix_mmap_threshold
    from gm_shell.fragments import Role

    if setting == "fixed":
        assert fix_mmap_threshold(MiB)
    codec, n = one_fragment_codec(mib, Compression.ZSTD)
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
    start = status_kib("VmRSS")
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
        "peak_growth": (status_kib("VmHWM") - start) / 1024,
        "end_growth": (status_kib("VmRSS") - start) / 1024,
        "times": times[1:],  # the first round warms the codecs up
        "cpu": cpu[1:],
    }


def owner(trace: Any) -> str:
    """The innermost gm function of an allocation's traceback (else its innermost frame)."""
    frames = list(reversed(trace.traceback))  # most recent first
    for frame in frames:
        if "/gm_shell/" in frame.filename or "/gm_core/" in frame.filename:
            path = frame.filename.split("/src/")[-1]
            return f"{path}:{frame.lineno}"
    return f"{frames[0].filename.split('/')[-1]}:{frames[0].lineno}" if frames else "?"


class Sampler:
    """Resident memory every ``every_s`` on a thread; what is live at each new high."""

    def __init__(self, model: Any, trace: bool, every_s: float = 0.005) -> None:
        self.model = model
        self.trace = trace
        self.every_s = every_s
        self.stepped = False
        """Whether the trainer has made a step (its gradients exist), set by the trainer."""
        self.start = status_kib("VmRSS") * 1024
        self.at_start = self.note(self.start)
        self.best: dict[str, Any] = {"rss": self.start}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            rss = status_kib("VmRSS") * 1024
            if rss > self.best["rss"] + 2 * MiB:
                self.best = self.note(rss)

    def note(self, rss: int) -> dict[str, Any]:
        import tracemalloc

        # Never p.grad here: reading it while the training thread sets it (zero_grad,
        # backward) crashed libtorch_python once. The gradients are the parameters' size,
        # held from the first backward on.
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        torch_bytes = {"torch params": params, "torch grads": params if self.stepped else 0}
        from gm_shell.allocator import malloc_figures

        noted: dict[str, Any] = {"rss": rss, **malloc_figures(), **torch_bytes}
        if self.trace and tracemalloc.is_tracing():
            noted["traced"] = tracemalloc.get_traced_memory()[0]
            owners: dict[str, int] = {}
            for t in tracemalloc.take_snapshot().traces:
                if t.size >= BIG:
                    owners[owner(t)] = owners.get(owner(t), 0) + t.size
            noted["owners"] = owners
        return noted


def live_node(spec: dict[str, Any]) -> None:
    """One node of ``--live``: train until the stop file appears; write its figures."""
    import numpy as np
    import torch

    from gm_shell import DiLoCo, Session, SessionOptions
    from gm_shell.stores import MailboxOptions

    if spec["trace"]:
        import tracemalloc

        tracemalloc.start(16)
    torch.set_num_threads(1)
    torch.manual_seed(spec["seed"])
    layers = int(spec["layers"])
    width = int((spec["mib"] * MiB / 4 / layers) ** 0.5)
    middle = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    model = torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.Tanh(), *middle, torch.nn.Linear(width, 1)
    )
    lr = 0.05 * 16 / width
    options = SessionOptions(poll_s=0.05, renew_s=0.5, **spec["options"])
    mailbox = MailboxOptions(backoff_base_s=0.02, backoff_cap_s=0.5, seed=0)
    rng = np.random.default_rng(spec["seed"])
    teacher = np.random.default_rng(1234).normal(size=(8, 1)).astype(np.float32)
    stop = Path(spec["stop"])
    session = Session(
        model, algorithm=DiLoCo(**spec["algorithm"]), mailbox=spec["url"], node=spec["node"],
        role=spec["role"], options=options, mailbox_options=mailbox,
    )  # fmt: skip
    with session:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        sampler = Sampler(model, spec["trace"])
        sampler.thread.start()
        while not stop.exists():
            x = torch.from_numpy(rng.normal(size=(32, 8)).astype(np.float32))
            loss = ((model(x) - x @ torch.from_numpy(teacher)) ** 2).mean()
            model.zero_grad()
            loss.backward()
            sampler.stepped = True
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-lr)  # in place: no gradient-sized temporary
            session.step(samples=32)
            time.sleep(0.02)
    sampler.stop.set()
    sampler.thread.join()
    result = {
        "node": spec["node"],
        "start": sampler.start,
        "peak": status_kib("VmHWM") * 1024,
        "end": status_kib("VmRSS") * 1024,
        "at_start": sampler.at_start,
        "at_high": sampler.best,
    }
    Path(spec["out"]).write_text(json.dumps(result))


def live(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--live``: two nodes in their own processes for ``--rounds`` commits; their figures."""
    options: dict[str, Any] = {}
    if args.threshold:
        options["mmap_threshold"] = MiB
    if args.no_spill:
        options["spill_above"] = None
    elif args.spill_above is not None:
        options["spill_above"] = int(args.spill_above * MiB)
    algorithm = {
        "sync_every": 16, "fragments": max(2, args.layers), "quorum": 2, "in_flight": 2,
        "lease_timeout_s": 2.0, "takeover_floor_s": 3.0,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        procs = {}
        for node, role, seed in (("n0", "both", 0), ("n1", "learner", 1)):
            spec = {
                "node": node, "role": role, "seed": seed, "mib": args.mib, "layers": args.layers,
                "trace": args.trace,
                "url": f"file://{work / 'bucket'}", "algorithm": algorithm, "options": options,
                "stop": str(work / "stop"), "out": str(work / f"{node}.json"),
            }  # fmt: skip
            cmd = [sys.executable, "-m", "bench.bench_memory", "--node", json.dumps(spec)]
            procs[node] = subprocess.Popen(cmd, cwd=HERE.parent)
            time.sleep(3.0 if node == "n0" else 0.0)  # n0 creates the run
        records = work / "bucket" / "rounds"
        deadline = time.monotonic() + 60 + 10 * args.rounds
        while time.monotonic() < deadline and _commits(records) < args.rounds:
            if any(proc.poll() is not None for proc in procs.values()):
                break  # a node died: stop the other and say so below
            time.sleep(0.2)
        (work / "stop").write_text("stop")
        for proc in procs.values():
            proc.wait(120)
        codes = {node: proc.returncode for node, proc in procs.items()}
        if any(codes.values()):
            raise SystemExit(f"a node failed: exit codes {codes}")
        print(f"{_commits(records)} commits")
        return [json.loads((work / f"{n}.json").read_text()) for n in procs]


def _commits(records: Path) -> int:
    return len(list(records.iterdir())) if records.exists() else 0


def print_live(results: list[dict[str, Any]], mib: float) -> None:
    for r in results:
        high, low = r["at_high"], r["at_start"]
        growth = (r["peak"] - r["start"]) / MiB
        print(
            f"{r['node']}: start {r['start'] / MiB:.0f} MiB, growth to the peak {growth:.0f} MiB"
            f" ({growth / mib:.1f} x model), at the end {(r['end'] - r['start']) / MiB:.0f} MiB"
        )
        print(f"  MiB at the start and at the highest sample (RSS {high['rss'] / MiB:.0f}):")
        for name in ("heap_used", "mapped", "heap_free", "traced", "torch params", "torch grads"):
            if name in high:
                print(f"    {name:<14} {low[name] / MiB:8.1f} {high[name] / MiB:8.1f}")
        owners = high.get("owners", {})
        for where in sorted(owners, key=lambda w: -owners[w]):
            was = low.get("owners", {}).get(where, 0)
            print(f"    {where:<36} {was / MiB:8.1f} {owners[where] / MiB:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16, help="the fragment's (model's) size")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each setting, alternately")
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--live", action="store_true", help="two nodes of a live run")
    parser.add_argument(
        "--layers", type=int, default=1, help="--live: square layers (and fragments) in --mib"
    )
    parser.add_argument("--trace", action="store_true", help="--live: tracemalloc in the nodes")
    parser.add_argument("--threshold", action="store_true", help="--live: mmap_threshold 1 MiB")
    parser.add_argument(
        "--no-spill", action="store_true", help="--live: spill_above None (deltas in memory)"
    )
    parser.add_argument("--spill-above", type=float, help="--live: spill_above, in MiB")
    parser.add_argument("--node", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node:
        live_node(json.loads(args.node))
        return
    if args.live:
        print(f"load {os.getloadavg()[0]:.2f}; model {args.mib} MiB, {args.rounds} rounds")
        print_live(live(args), args.mib)
        print(f"load {os.getloadavg()[0]:.2f}")
        return
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
