"""gm next to the reference package gradientmail 0.0.2: the same scenarios, ratios in one run.

Run (after ``make install`` and ``bash bench/setup_reference.sh``)::

    .venv/bin/python bench/compare.py                 # every figure, about 3-4 minutes
    .venv/bin/python bench/compare.py --only 1 2      # some figures
    .venv/bin/python bench/compare.py --json out.json # also keep the raw figures
    .venv/bin/python bench/compare.py --smoke         # every figure, tiny, in seconds

The reference side runs in ``bench/.venv-ref`` (Python 3.12) as subprocesses, one script
of ``bench/reference/`` per figure, each printing JSON; when that venv is missing or broken
the comparison says why and prints gm's figures alone. ``bench/README.md`` explains every
figure and holds the tables of the last recorded run.

Both sides run their real runtimes. gm's figures 1-3 drive ``gm_shell.Session`` nodes over
a bucket every request reaches through :mod:`latency` (a sleep per request, a journal of
requests), see :mod:`gm_runs`; the reference's drive its ``Session``, ``Learner`` and
``Syncer`` over its ``MemoryMailbox`` through the same kind of wrapper
(``reference/refkit.py``), with the same latency. Figure 4 times the same work on both
sides, from delta payload bytes to commit payload bytes. ``--smoke`` runs every figure at a
tiny size (the test suite runs it to keep the benchmark working; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from gm_core.numerics import Contributions, Layout
from gm_core.records import AlgorithmConfig, MergeRule, TensorSpec, WireFormat
from gm_core.verdicts import merge_weight, normalized_weights
from gm_shell.accounting import PRICES_S3, Stats, cost_usd

try:  # run as ``python bench/compare.py`` (bench/ on sys.path) or as ``python -m bench.compare``
    from bench import gm_runs
except ModuleNotFoundError:
    import gm_runs  # type: ignore[no-redef]

BENCH = Path(__file__).resolve().parent
REF_PYTHON = BENCH / ".venv-ref" / "bin" / "python"
REF_SCRIPTS = BENCH / "reference"
CLASSES = ("LIST", "GET", "PUT", "DELETE")
ROUNDS_PER_DAY_AT_30_S = 24 * 3600 / 30
SMOKE = {
    "rounds": 3,
    "sync_every": 16,
    "scale": 0.05,
    "latency_ms": [0.0, 5.0],
    "path_rounds": 5,
    "join_rounds": 20,
    "join_latency_ms": 5.0,
    "merge_mib": 1,
    "repeat": 1,
    "steps": 2000,
}
"""``--smoke``: every figure at a size that runs in seconds."""


# --- the reference side -------------------------------------------------------------------------


def reference_status() -> str | None:
    """None when the reference venv can run the harness, else why not."""
    if not REF_PYTHON.exists():
        return (
            f"{REF_PYTHON.relative_to(BENCH.parent)} is missing: run bash bench/setup_reference.sh"
        )
    probe = subprocess.run(
        [str(REF_PYTHON), "-c", "import gradientmail, numpy"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the reference venv cannot import gradientmail: {last}"
    return None


def reference(script: str, *args: str, timeout_s: float = 900) -> dict[str, Any]:
    """Run one reference harness script; its JSON, or ``{"error": why}``."""
    try:
        proc = subprocess.run(
            [str(REF_PYTHON), str(REF_SCRIPTS / script), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REF_SCRIPTS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{script} ran past {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{script} exited {proc.returncode}: {last}"}
    result: dict[str, Any] = json.loads(lines[-1])
    if result.get("error"):
        return {"error": f"{script}: {result['error']}"}
    return result


def failed(error: Exception) -> dict[str, Any]:
    """A figure of gm's that could not be measured: say why, and go on with the others."""
    return {"error": f"gm's side failed: {type(error).__name__}: {error}"}


# --- figure 1: requests and cost per round ------------------------------------------------------


def cost_of(per_round: dict[str, float]) -> float:
    stats = Stats(
        list_requests=round(per_round["LIST"] * 1000),
        get_requests=round(per_round["GET"] * 1000),
        put_requests=round(per_round["PUT"] * 1000),
        delete_requests=round(per_round["DELETE"] * 1000),
    )
    return cost_usd(stats, PRICES_S3) / 1000


def figure_requests(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    try:
        gm = gm_runs.requests_per_round(
            nodes=args.nodes,
            poll_s=args.poll,
            step_s=args.step,
            sync_every=args.sync_every,
            fragments=args.fragments,
            rounds=args.rounds,
            scale=args.scale,
            latency_ms=args.cost_latency_ms,
        )
    except Exception as error:
        gm = failed(error)
    ref = (
        reference(
            "fig_requests.py",
            *("--nodes", str(args.nodes), "--poll", str(args.poll), "--step", str(args.step)),
            *("--sync-every", str(args.sync_every), "--fragments", str(args.fragments)),
            *("--rounds", str(args.rounds), "--scale", str(args.scale)),
            *("--latency-ms", f"{args.cost_latency_ms:g}"),
        )
        if ref_ok
        else {"error": "skipped"}
    )
    print(
        f"\nFigure 1. Store requests and S3 request cost per round: {args.nodes} nodes "
        f"(learner + closer each), poll {args.poll:g} s, step {args.step:g} s, "
        f"H={args.sync_every}, P={args.fragments}: a round every "
        f"{args.sync_every // args.fragments * args.step:g} s; "
        f"{args.cost_latency_ms:g} ms per request"
    )
    print(f"  gm:        {gm.get('runtime', gm.get('error'))}")
    print(f"  reference: {ref.get('runtime', ref.get('error'))}")
    print(
        f"  both:      time scaled x{args.scale:g} (a protocol second, and the latency, "
        f"last {args.scale:g} of themselves)"
    )
    rows = []
    for cls in CLASSES:
        label = "GET/HEAD" if cls == "GET" else cls
        rows.append((label, per(gm, cls), per(ref, cls)))
    rows.append(("all requests", total(gm), total(ref)))
    table(["per round", "gm", "reference", "gm/ref"], rows, ratio="a/b")
    gm_cost = cost_of(gm["per_round"]) if "per_round" in gm else None
    ref_cost = cost_of(ref["per_round"]) if "per_round" in ref else None
    cost_rows = [
        ("$ per round", gm_cost, ref_cost),
        (
            "$ per day, a round per 30 s",
            None if gm_cost is None else gm_cost * ROUNDS_PER_DAY_AT_30_S,
            None if ref_cost is None else ref_cost * ROUNDS_PER_DAY_AT_30_S,
        ),
    ]
    table(["S3 request cost", "gm", "reference", "gm/ref"], cost_rows, ratio="a/b", fmt="{:.5f}")
    if gm_cost is not None and ref_cost:
        share = gm_cost / ref_cost
        verdict = "met" if share <= 1 / 20 else "NOT met"
        print(f"  goal: gm's cost <= 1/20 of the reference's: {verdict} (1/{1 / share:.0f})")
    extra = [
        ("round length (s)", gm.get("round_s"), ref.get("round_s")),
        (
            "participants per round",
            gm.get("participants_per_round"),
            ref.get("participants_per_round"),
        ),
        ("rounds in the window", gm.get("window_rounds"), ref.get("window_rounds")),
    ]
    table(["", "gm", "reference", ""], extra, ratio=None, fmt="{:.1f}")
    objects(gm, ref)
    return {"gm": gm, "reference": ref}


def per(side: dict[str, Any], cls: str) -> float | None:
    return side["per_round"][cls] if "per_round" in side else None


def total(side: dict[str, Any]) -> float | None:
    return sum(side["per_round"].values()) if "per_round" in side else None


def objects(gm: dict[str, Any], ref: dict[str, Any]) -> None:
    """Per-round requests by the protocol object they touch (where the chatter goes)."""
    for label, side in (("gm", gm), ("reference", ref)):
        table_ = side.get("per_round_by_object")
        if not table_:
            continue
        parts = []
        for cat, counts in sorted(table_.items(), key=lambda kv: -sum(kv[1].values())):
            inner = " ".join(f"{cls} {n:.1f}" for cls, n in counts.items() if n)
            parts.append(f"{cat}: {inner}")
        print(f"  {label} by object: " + "; ".join(parts))


# --- figure 2: round time under latency, the critical path ---------------------------------------


def figure_critical_path(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    tensors, elements = 8, 65536
    try:
        gm = gm_runs.critical_path(
            latencies_ms=args.latency_ms,
            rounds=args.path_rounds,
            sync_every=args.sync_every,
            fragments=args.fragments,
            tensors=tensors,
            elements=elements,
        )
    except Exception as error:
        gm = failed(error)
    ref = (
        reference(
            "fig_critical_path.py",
            "--latency-ms",
            *(f"{ms:g}" for ms in args.latency_ms),
            *("--rounds", str(args.path_rounds), "--elements", str(elements)),
            *("--tensors", str(tensors)),
            *("--sync-every", str(args.sync_every), "--fragments", str(args.fragments)),
        )
        if ref_ok
        else {"error": "skipped"}
    )
    print(
        "\nFigure 2. A closer's round time under injected per-request latency: 4 learners' "
        "snapshots already in the store, the closer alone closes round after round "
        f"(fragment of {tensors // args.fragments * elements * 4 // 1024} KiB, "
        "4 contributions)"
    )
    print(f"  gm:        {gm.get('runtime', gm.get('error'))}")
    print(f"  reference: {ref.get('runtime', ref.get('error'))}")
    gm_rows = {r["latency_ms"]: r for r in gm.get("results", [])}
    ref_rows = {r["latency_ms"]: r for r in ref.get("results", [])}
    rows = []
    for ms in args.latency_ms:
        g, r = gm_rows.get(ms, {}), ref_rows.get(ms, {})
        rows.append((f"{ms:g} ms per request", g.get("round_s_median"), r.get("round_s_median")))
    table(["round time (s), median", "gm", "reference", "ref/gm"], rows, ratio="b/a", fmt="{:.4f}")
    seq_rows = []
    for ms in args.latency_ms:
        if ms <= 0:
            continue
        g, r = gm_rows.get(ms, {}), ref_rows.get(ms, {})
        seq_rows.append((f"at {ms:g} ms (slope)", g.get("slope_requests"), r.get("slope_requests")))
        seq_rows.append((f"at {ms:g} ms (waves)", g.get("waves_median"), r.get("waves_median")))
        seq_rows.append(
            (
                "  of which merge -> record",
                g.get("commit_waves_median"),
                r.get("commit_waves_median"),
            )
        )
    table(["sequential requests", "gm", "reference", "ref/gm"], seq_rows, ratio="b/a", fmt="{:.1f}")
    per_round = []
    worst = max(args.latency_ms, default=0.0)
    g, r = gm_rows.get(worst, {}), ref_rows.get(worst, {})
    for cls in CLASSES:
        per_round.append(
            (
                f"  {cls} at {worst:g} ms",
                g.get("requests_per_round", {}).get(cls),
                r.get("requests_per_round", {}).get(cls),
            )
        )
    table(["requests per round", "gm", "reference", "ref/gm"], per_round, ratio="b/a")
    if g.get("round_s_median") and r.get("round_s_median"):
        speedup = r["round_s_median"] / g["round_s_median"]
        verdict = "met" if speedup >= 3 else "NOT met"
        print(f"  goal: >= 3x faster at {worst:g} ms: {verdict} ({speedup:.1f}x)")
    return {"gm": gm, "reference": ref}


# --- figure 3: joining and taking over after many rounds -----------------------------------------


def figure_join(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    lat = args.join_latency_ms
    try:
        gm = gm_runs.join_and_takeover(
            rounds=args.join_rounds,
            latency_ms=lat,
            sync_every=args.sync_every,
            fragments=args.fragments,
        )
    except Exception as error:
        gm = failed(error)
    ref = (
        reference(
            "fig_join.py",
            *("--rounds", str(args.join_rounds), "--latency-ms", f"{lat:g}"),
            *("--sync-every", str(args.sync_every), "--fragments", str(args.fragments)),
        )
        if ref_ok
        else {"error": "skipped"}
    )
    print(
        f"\nFigure 3. Joining and taking over after {args.join_rounds} rounds "
        f"(P={args.fragments}): requests to get going"
    )
    print(f"  gm:        {gm.get('runtime', gm.get('error'))}")
    print(
        "  reference: "
        + (
            ref.get("error")
            or "Learner.join(); Syncer.recover(); a new Syncer.run() to its first commit"
        )
    )
    quiet, slow = "at_0", f"at_{lat:g}"
    g_join = gm.get("join", {}).get(quiet, {}).get("requests")
    g_claim = gm.get("takeover", {}).get(quiet, {}).get("to_claim")
    g_commit = gm.get("takeover", {}).get(quiet, {}).get("to_commit")
    r_join = ref.get("join", {}).get("requests")
    r_recover = ref.get("takeover", {}).get("requests")
    r_commit = ref.get("takeover_to_commit", {}).get("requests")
    rows: list[tuple[str, float | None, float | None]] = []
    for label, g, r in (
        ("join (start -> joined)", g_join, r_join),
        ("takeover (start -> first commit)", g_commit, r_commit),
        ("  gm: start -> its claim", g_claim, None),
        ("  reference: recover() alone", None, r_recover),
    ):
        rows.append((label, sum(g.values()) if g else None, sum(r.values()) if r else None))
        if label.startswith("  "):
            continue
        for cls in ("LIST", "GET", "PUT"):
            rows.append((f"  {cls}", g[cls] if g else None, r[cls] if r else None))
    table(["requests", "gm", "reference", "ref/gm"], rows, ratio="b/a", fmt="{:.0f}")
    gj = gm.get("join", {}).get(slow, {})
    gt = gm.get("takeover", {}).get(slow, {})
    rj, rt = ref.get("join", {}), ref.get("takeover_to_commit", {})
    table(
        [f"at {lat:g} ms/request", "gm", "reference", "ref/gm"],
        [
            ("join: seconds", gj.get("seconds"), rj.get("wall_s_at_latency")),
            ("join: sequential requests", gj.get("waves"), rj.get("waves_at_latency")),
            (
                "takeover to commit: seconds",
                gt.get("seconds_to_commit"),
                rt.get("wall_s_at_latency"),
            ),
            ("  sequential requests", gt.get("waves_to_commit"), rt.get("waves_at_latency")),
        ],
        ratio="b/a",
        fmt="{:.2f}",
    )
    return {"gm": gm, "reference": ref}


# --- figure 4: a closer's compute for one round ---------------------------------------------------
# --- figure 4: merge + outer step throughput -----------------------------------------------------


def merge_inputs(path: Path, mib: int, k: int) -> dict[str, Any]:
    """One fragment of about ``mib`` MiB in four tensors (one an embedding), k contributions."""
    rng = np.random.default_rng(11)
    elements = mib * 2**20 // 4
    names = ["block.attn.weight", "block.mlp.down", "block.mlp.up", "embed.weight"]
    shapes = {n: (elements // len(names) // 256, 256) for n in names}
    arrays: dict[str, np.ndarray] = {"names": np.array(names)}
    for n in names:
        arrays[f"theta/{n}"] = (rng.standard_normal(shapes[n]) * 0.02).astype(np.float32)
        arrays[f"momentum/{n}"] = (rng.standard_normal(shapes[n]) * 1e-3).astype(np.float32)
        for i in range(k):
            arrays[f"delta{i}/{n}"] = (rng.standard_normal(shapes[n]) * 1e-3).astype(np.float32)
    tokens = np.array([30 * (256 + 16 * i) for i in range(k)])
    steps = np.array([30 - (i % 3) for i in range(k)])
    arrays["tokens"], arrays["steps"] = tokens, steps
    np.savez(path, **arrays)
    return arrays


def gm_close_round(
    arrays: dict[str, Any],
    rule: MergeRule,
    compute: str,
    repeat: int,
    wire: WireFormat = WireFormat.F32,
) -> dict[str, Any]:
    """gm's closer compute for one round, timed from delta payload bytes to commit payload bytes.

    What ``gm_shell.runtime`` does between fetching the snapshots' payloads and uploading the
    commit: each delta checked (size, blake3 digest), decoded and judged finite; the merge,
    Nesterov step and cosine on the ``compute`` backend; theta and momentum encoded and hashed,
    and the new theta brought back to the host for the commit cache. With a torch backend on an
    accelerator all of it but the checks and hashes runs there (``FragmentCodec.device``:
    decoding, merge, encoding), as the runtime does it; on CPU decoding and encoding run on the
    host (numpy) and the merge on the compute backend (``FragmentCodec.merge_held``). The
    current theta (host) and momentum (where the closer holds it) are held in memory, as a
    closer that committed the fragment before holds them. One fragment of all the tensors
    (P=1) in ``wire`` format, the run's config otherwise.
    """
    from gm_shell.fragments import FragmentCodec, Role, compute_backend
    from gm_shell.run import draft_manifest

    names = [str(n) for n in arrays["names"]]
    schema = tuple(
        TensorSpec(name=n, shape=tuple(arrays[f"theta/{n}"].shape), dtype="F32") for n in names
    )
    config = AlgorithmConfig(
        sync_every=1,
        fragments=1,
        in_flight=1,
        merge=rule,
        delta_format=wire,
        commit_format=wire,
    )
    manifest = draft_manifest(run_id="bench", node="closer", config=config, schema=schema)
    fragments = FragmentCodec(manifest, compute_backend(compute))
    device = fragments.device
    layout = fragments.layouts[0]

    def flat(prefix: str) -> np.ndarray:
        return np.concatenate([arrays[f"{prefix}/{s.name}"].reshape(-1) for s in layout.spans])

    k = len(arrays["tokens"])
    payloads = [fragments.encode(0, Role.DELTA, 1, flat(f"delta{i}")) for i in range(k)]
    theta0, momentum0 = flat("theta"), device.asarray(flat("momentum"))
    who = Contributions(
        learners=tuple(f"learner-{i}" for i in range(k)),
        weights=normalized_weights(
            [
                merge_weight(int(t), int(s))
                for t, s in zip(arrays["tokens"], arrays["steps"], strict=True)
            ]
        ),
    )
    best = float("inf")
    merged = None
    theta = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        deltas = [fragments.load(0, Role.DELTA, ref, data, device) for data, ref in payloads]
        merged = fragments.merge_held(0, theta0, momentum0, deltas, who)
        data, _ = fragments.encode(0, Role.THETA, 2, merged.theta, device)
        fragments.encode(0, Role.MOMENTUM, 2, merged.momentum, device)
        theta = fragments.brought_home(0, Role.THETA, merged.theta, data, device)
        best = min(best, time.perf_counter() - t0)
    assert merged is not None, "repeat must be at least 1"
    assert theta is not None
    return {
        "best_s": best,
        "delta_gb_per_s": k * layout.total * 4 / best / 1e9,
        "theta": theta,  # what agree() checks against the reference's result
        "momentum": device.to_numpy(merged.momentum),
        "layout": layout,
    }


def accelerator() -> str | None:
    """``auto``'s torch device where it is not the CPU (figure 4 then has a third side)."""
    if importlib.util.find_spec("torch") is None:
        return None
    from gm_shell.fragments import compute_backend

    chosen = compute_backend("auto")
    device = getattr(chosen, "device", None)
    return None if device is None or device.type == "cpu" else "auto"


def figure_merge(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gm-bench-") as tmp:
        inputs = Path(tmp) / "fragment.npz"
        arrays = merge_inputs(inputs, args.merge_mib, args.contributions)
        print(
            f"\nFigure 4. A closer's compute for one round, from the {args.contributions} delta "
            f"payloads' bytes to the commit's payload bytes: one fragment of {args.merge_mib} MiB "
            f"(4 tensors); GB/s of deltas ({args.contributions} x {args.merge_mib} MiB per round), "
            f"best of {args.repeat}"
        )
        print(
            "  both:      check + decode each delta, merge, Nesterov, cosine, "
            "encode + hash theta and momentum"
        )
        for rule in (MergeRule.MEAN, MergeRule.RDA):
            ref_out = Path(tmp) / f"ref-{rule.value}.npz"
            ref = (
                reference(
                    "fig_merge.py",
                    *("--inputs", str(inputs), "--out", str(ref_out)),
                    *("--merge", rule.value, "--repeat", str(args.repeat)),
                )
                if ref_ok
                else {"error": "skipped"}
            )
            sides: dict[str, dict[str, Any]] = {}
            for compute in ("numpy", "torch", accelerator()):
                if compute is None or (
                    compute == "torch" and importlib.util.find_spec("torch") is None
                ):
                    continue
                try:
                    sides[compute] = gm_close_round(
                        arrays, rule, compute, args.repeat, WireFormat(args.merge_format)
                    )
                except Exception as error:
                    sides[compute] = failed(error)
            agreement = None
            if "error" not in ref and ref_out.exists() and "theta" in sides["numpy"]:
                agreement = agree(sides["numpy"], np.load(ref_out))
            ref_rate = ref.get("delta_gb_per_s")
            rows = [
                (f"gm, {name} merge", side.get("delta_gb_per_s"), ref_rate)
                for name, side in sides.items()
            ]
            print(f"  merge rule: {rule.value}")
            for name, side in sides.items():
                if "error" in side:
                    print(f"  gm ({name}): {side['error']}")
            if "error" in ref:
                print(f"  reference: {ref['error']}")
            else:
                print(f"  reference: {ref['what']}, numpy adapter: {ref['best_s'] * 1e3:.1f} ms")
            for name, side in sides.items():
                if "best_s" in side:
                    print(f"  gm ({name} merge): {side['best_s'] * 1e3:.1f} ms")
            table(["GB/s of deltas", "gm", "reference", "gm/ref"], rows, ratio="a/b", fmt="{:.2f}")
            if agreement is not None:
                print(
                    "  same inputs, same result: max |gm - ref| / max |ref| = "
                    f"theta {agreement['theta']:.1e}, momentum {agreement['momentum']:.1e}"
                )
            out[rule.value] = {
                "gm": {
                    name: {
                        k: v for k, v in side.items() if k in ("best_s", "delta_gb_per_s", "error")
                    }
                    for name, side in sides.items()
                },
                "reference": ref,
                "agreement": agreement,
            }
    return out


def agree(side: dict[str, Any], ref: Any) -> dict[str, float]:
    layout: Layout = side["layout"]
    result = {}
    for what in ("theta", "momentum"):
        worst, scale = 0.0, 0.0
        for span in layout.spans:
            ours = side[what][span.start : span.stop]
            theirs = ref[f"{what}/{span.name}"].reshape(-1)
            worst = max(worst, float(np.max(np.abs(ours - theirs))))
            scale = max(scale, float(np.max(np.abs(theirs))))
        result[what] = worst / scale if scale else worst
    return result


# --- figure 5: step() overhead --------------------------------------------------------------------


def gm_step(steps: int) -> dict[str, Any]:
    """gm's ``Session.step()`` cost with no round due, measured like the reference's.

    One session (role both) over ``memory://`` with a two-layer torch model and ``sync_every``
    far beyond the run; the loop is ``for batch in data: train(batch); s.step(samples=1)``,
    and the figure is the gap between one ``train`` call's return and the next one's start.
    """
    if importlib.util.find_spec("gm_shell.session") is None:
        return {"pending": "gm_shell.session does not exist yet"}
    try:
        import torch

        from gm_shell.session import DiLoCo, Session
    except Exception as error:
        return {"pending": f"gm_shell.session does not import: {type(error).__name__}: {error}"}
    enter: list[int] = []
    leave: list[int] = []

    def train(_batch: int) -> None:
        enter.append(time.perf_counter_ns())
        leave.append(time.perf_counter_ns())

    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        session = Session(
            model,
            algorithm=DiLoCo(sync_every=10**9, fragments=4),
            mailbox="memory://",
            node="solo",
        )
        session.start()
        try:
            for batch in range(steps):
                train(batch)
                session.step(samples=1)
        finally:
            session.close()
    except Exception as error:
        return {"pending": f"gm's Session failed: {type(error).__name__}: {error}"}
    gaps = [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]
    enter.clear()
    leave.clear()
    for batch in range(steps):
        train(batch)
    bare = [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]
    return {
        "runtime": "real: gm_shell.session.Session over memory://, torch model",
        "session": gap_summary(gaps),
        "bare_loop": gap_summary(bare),
    }


def gap_summary(gaps_ns: list[int]) -> dict[str, float]:
    ordered = sorted(gaps_ns)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3

    return {
        "median_us": statistics.median(ordered) / 1e3,
        "mean_us": statistics.fmean(ordered) / 1e3,
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
    }


def figure_step(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    ref = reference("fig_step.py", "--steps", str(args.steps)) if ref_ok else {"error": "skipped"}
    gm = gm_step(args.steps)
    print(
        f"\nFigure 5. What a session adds to each training step when no round is due "
        f"({args.steps} steps of a no-op training function; gap between consecutive calls)"
    )
    print(f"  gm:        {gm.get('runtime') or 'pending: ' + gm['pending']}")
    print(f"  reference: {ref.get('error') or 'gradientmail Session.run, MemoryMailbox'}")
    rows = []
    for label, key in (
        ("median", "median_us"),
        ("p90", "p90_us"),
        ("p99", "p99_us"),
        ("mean", "mean_us"),
    ):
        rows.append(
            (
                label,
                gm["session"][key] if "session" in gm else None,
                ref["session"][key] if "session" in ref else None,
            )
        )
    rows.append(
        (
            "bare loop, median",
            gm["bare_loop"]["median_us"] if "bare_loop" in gm else None,
            ref["bare_loop"]["median_us"] if "bare_loop" in ref else None,
        )
    )
    table(["overhead per step (us)", "gm", "reference", "ref/gm"], rows, ratio="b/a", fmt="{:.2f}")
    return {"gm": gm, "reference": ref}


# --- printing -------------------------------------------------------------------------------------


def table(
    header: list[str],
    rows: list[tuple[str, float | None, float | None]],
    *,
    ratio: str | None,
    fmt: str = "{:.1f}",
) -> None:
    def cell(x: float | None) -> str:
        return "-" if x is None else fmt.format(x)

    def ratio_cell(a: float | None, b: float | None) -> str:
        if ratio is None or a is None or b is None:
            return ""
        num, den = (a, b) if ratio == "a/b" else (b, a)
        if den == 0:
            return "-"
        value = num / den
        return f"{value:.3f}" if value < 1 else f"{value:.1f}x"

    width = max(len(header[0]), *(len(r[0]) for r in rows)) + 2
    print("  " + header[0].ljust(width) + "".join(h.rjust(12) for h in header[1:]))
    for label, a, b in rows:
        print(
            "  "
            + label.ljust(width)
            + cell(a).rjust(12)
            + cell(b).rjust(12)
            + ratio_cell(a, b).rjust(12)
        )


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items() if not isinstance(v, np.ndarray | Layout)}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.floating | np.integer):
        return x.item()
    return x


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", type=int, nargs="+", choices=range(1, 6), help="figures to run")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--smoke", action="store_true", help="every figure, tiny (seconds)")
    parser.add_argument("--gm-only", action="store_true", help="leave the reference side out")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval, seconds")
    parser.add_argument("--step", type=float, default=1.0, help="training step, seconds")
    parser.add_argument("--sync-every", type=int, default=120, help="H")
    parser.add_argument("--fragments", type=int, default=4, help="P")
    parser.add_argument("--rounds", type=int, default=10, help="figure 1: rounds per node")
    parser.add_argument("--scale", type=float, default=0.1, help="figure 1: time scale")
    parser.add_argument(
        "--cost-latency-ms", type=float, default=20.0, help="figure 1: ms per request (unscaled)"
    )
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0, 50.0])
    parser.add_argument("--path-rounds", type=int, default=12, help="figure 2: rounds closed")
    parser.add_argument("--join-rounds", type=int, default=1000)
    parser.add_argument("--join-latency-ms", type=float, default=50.0)
    parser.add_argument("--merge-mib", type=int, default=16)
    parser.add_argument("--contributions", type=int, default=4)
    parser.add_argument(
        "--merge-format",
        default="F32",
        choices=[f.value for f in WireFormat],
        help="figure 4: the deltas' and commits' wire format (the reference's side is f32)",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20000, help="figure 5: steps timed")
    args = parser.parse_args()
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    figures = set(args.only or range(1, 6))

    status = "left out (--gm-only)" if args.gm_only else reference_status()
    print("gm vs gradientmail 0.0.2 (the reference)" + (" -- smoke run" if args.smoke else ""))
    print(
        f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()} (gm); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"  load average at start: {load} (timings are noisy on a busy machine; counts are not)")
    if status is None:
        print(f"  reference: {REF_PYTHON.relative_to(BENCH.parent)} (subprocesses)")
    else:
        print(f"  reference: unavailable, gm's figures only: {status}")
    ref_ok = status is None
    started = time.perf_counter()
    results: dict[str, Any] = {"reference_status": status or "ok"}
    runners = {
        1: ("requests", figure_requests),
        2: ("critical_path", figure_critical_path),
        3: ("join", figure_join),
        4: ("merge", figure_merge),
        5: ("step", figure_step),
    }
    for number in sorted(figures):
        key, run = runners[number]
        results[key] = run(args, ref_ok)
        sys.stdout.flush()
    print(f"\n(done in {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(jsonable(results), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
