"""What authenticated runs cost (issue 12 item 1): tags and digests, then whole runs.

Run: ``nice -n 10 .venv/bin/python -m bench.bench_auth [--repeat 5] [--json out.json]``
(``make bench-auth``; ``--smoke`` runs everything at a tiny size in seconds, its figures
mean nothing; ``--only hash`` or ``--only runs`` runs one part).

**Hashing** (one thread, the same bytes for every algorithm, algorithms interleaved within
each repeat so a change of load falls on all of them; each figure the best of short timed
batches, the one other processes disturbed least): ``Envelope.seal`` and ``Envelope.open``
(the gm/2 header and HMAC-SHA256 over the framed run id, object key and body: what every
JSON object costs) next to the bare HMAC over the body, keyed BLAKE3, unkeyed BLAKE3 and
plain SHA-256 over 2 KiB (a record), 64 KiB and 64 MiB, and with per-node keys
(``seal signed``/``open signed``: the tag, then an Ed25519 signature by the writer and its
check against the roster, spec/protocol.md §16.3); GB/s, µs per 2 KiB object, and
ratios to unkeyed BLAKE3. Then the payload path, ``gm_shell.payload.content_hash`` keyed
(an authenticated run's digests) against unkeyed (an open run's) over a 64 MiB payload.

**Runs** (real ``Session``s over real ``file://`` buckets; each repeat runs the open and the
authenticated side back to back, alternating which goes first):

* ``step()`` on due steps: ``bench_step.gm_loop``'s loop (learner and closer in one node,
  128 KiB model, H=8, P=2, a round every 4 steps, 10 ms steps, 10 ms poll) over ``file://``;
  median and p99 of the gap ``step()`` adds on due steps at which no commit was waited for.
* A closer's round: ``gm_runs.critical_path`` (four learners' snapshots already in the
  bucket, one closer-only session closes round after round) on a ``LocalStore`` through the
  journaled store at each ``--latency-ms`` (default 0 and 20 ms a request): round time
  (median interval between record writes), sequential requests on the path (waves),
  requests per round, and two figures less exposed to the other processes on the machine:
  the CPU time of the closer's event-loop thread (where the core, and so every tag and
  verification, runs) per round, and the CPU time spent inside ``Envelope.open`` and
  ``Envelope.seal`` on that thread per round, by operation and object kind (the keyed
  side's extra work itself; timed by wrapping the two methods on every side alike).

Three sides: open, a run key (``keyed``), and a run key with per-node keys (``signed``:
every object the nodes write is signed, every one they read checked; the critical path's
prefilled snapshots are signed by their learners). Every figure is printed per side as the
median over repeats with the spread (min-max of the
repeats) and the authenticated/open ratio; the spread of the open side is the noise floor a
difference has to exceed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import hmac
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import blake3

from bench import bench_step, gm_runs
from gm_core import auth, keys
from gm_shell.payload import content_hash

RUN_KEY = bytes(range(32))
"""A fixed key: the figures do not depend on it."""

KEY_NAME = "snapshots/000000000042/learner-a.json"
"""An object key of the length a snapshot's has (the tag covers it)."""

SIDES = ("open", "keyed", "signed")
"""An open run, a run key, a run key and per-node keys (Ed25519)."""
RUN_KEYS: dict[str, bytes | None] = {"open": None, "keyed": RUN_KEY, "signed": RUN_KEY}

BATCH_S = 0.002
"""How long one timed batch of calls lasts (the best batch of a measurement counts)."""


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cpus"


# --- hashing --------------------------------------------------------------------------------


def hashers(data: bytes) -> dict[str, Callable[[bytes], object]]:
    """Each algorithm as a function of the bytes; ``open`` verifies ``data`` sealed."""
    run_auth = auth.derive(RUN_KEY)
    envelope = auth.for_run("bench-run-id", run_auth)
    payload_key = run_auth.payload_key
    sealed = envelope.seal(KEY_NAME, data)

    signer = signed_envelope("learner-a")
    signed = signer.seal(KEY_NAME, data)

    def open_(_data: bytes) -> object:
        body = envelope.open(KEY_NAME, sealed)
        assert not isinstance(body, auth.Unauthenticated), body
        return body

    def open_signed(_data: bytes) -> object:
        body = signer.open(KEY_NAME, signed)
        assert not isinstance(body, auth.Unauthenticated), body
        return body

    return {
        "seal (HMAC-SHA256)": lambda data: envelope.seal(KEY_NAME, data),
        "open (HMAC-SHA256)": open_,
        "seal signed (Ed25519)": lambda data: signer.seal(KEY_NAME, data),
        "open signed (Ed25519)": open_signed,
        "HMAC-SHA256 alone": lambda data: hmac.digest(run_auth.tag_key, data, "sha256"),
        "BLAKE3 keyed": lambda data: blake3.blake3(data, key=payload_key).digest(),
        "BLAKE3": lambda data: blake3.blake3(data).digest(),
        "SHA-256": lambda data: hashlib.sha256(data).digest(),
    }


def signed_envelope(node: str) -> auth.Envelope:
    """The envelope of ``node`` (a learner) in a run with per-node keys: HMAC tag, then an
    Ed25519 signature (gm_shell.nodekeys, the ``cryptography`` package)."""
    from bench.gm_runs import bench_roster, node_key
    from gm_shell import nodekeys

    roster = bench_roster({node: ("learner",)})
    signing = auth.Signing(
        roster=roster, verify=nodekeys.verify, node=node, sign=nodekeys.signer(node_key(node))
    )
    return auth.for_run("bench-run-id", attrs.evolve(auth.derive(RUN_KEY), signing=signing))


def seconds_per_call(fn: Callable[[bytes], object], data: bytes, budget_s: float) -> float:
    """Seconds one call of ``fn(data)`` takes: the best of short timed batches.

    A batch runs as many calls as fill ``BATCH_S`` (at least one); as many batches as fit
    ``budget_s`` run (at least 3, at most 50). The best batch is the one the other
    processes on a loaded machine interrupted least (timeit's rule), so it is the cost of
    the computation itself; batches shorter than a scheduler slice make such a window likely.
    """
    fn(data)
    started = time.perf_counter()
    fn(data)
    once = max(time.perf_counter() - started, 1e-9)
    calls = max(1, int(BATCH_S / once))
    batches = min(50, max(3, int(budget_s / (calls * once))))
    best = float("inf")
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(calls):
            fn(data)
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def hashing(sizes: list[int], repeat: int, budget_s: float) -> dict[str, Any]:
    """Seconds per call of each algorithm at each size, ``repeat`` times, interleaved."""
    figures: dict[str, Any] = {}
    for size in sizes:
        data = os.urandom(size)
        algorithms = hashers(data)
        samples: dict[str, list[float]] = {name: [] for name in algorithms}
        for _ in range(repeat):
            for name, fn in algorithms.items():
                samples[name].append(seconds_per_call(fn, data, budget_s))
        figures[str(size)] = samples
    return figures


def payload_path(size: int, repeat: int, budget_s: float) -> dict[str, list[float]]:
    """``content_hash`` keyed and unkeyed over the same payload, interleaved."""
    data = os.urandom(size)
    key = auth.derive(RUN_KEY).payload_key
    ways: dict[str, Callable[[bytes], object]] = {
        "content_hash(data)": content_hash,
        "content_hash(data, key)": lambda d: content_hash(d, key),
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeat):
        for name, fn in ways.items():
            samples[name].append(seconds_per_call(fn, data, budget_s))
    return samples


def size_name(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def print_hashing(figures: dict[str, Any], payload: dict[str, list[float]]) -> None:
    print("\nTag / verify / digest throughput, one thread (GB/s: median of repeats, min-max;")
    print("  each repeat the best of its timed batches; vs BLAKE3: time / unkeyed BLAKE3's)")
    print(f"  {'':<22}{'size':>8}{'GB/s':>8}{'spread':>13}{'us/object':>11}{'vs BLAKE3':>11}")
    for size_text, samples in figures.items():
        size = int(size_text)
        base = statistics.median(samples["BLAKE3"])
        for name, seconds in samples.items():
            rates = [size / s / 1e9 for s in seconds]
            median_s = statistics.median(seconds)
            per_object = f"{median_s * 1e6:.1f}" if size < 1 << 20 else "-"
            print(
                f"  {name:<22}{size_name(size):>8}{statistics.median(rates):>8.2f}"
                f"{spread(rates):>13}{per_object:>11}{median_s / base:>10.2f}x"
            )
    plain = statistics.median(payload["content_hash(data)"])
    print("\nPayload digests (gm_shell.payload.content_hash), time per payload")
    for name, seconds in payload.items():
        median_s = statistics.median(seconds)
        print(
            f"  {name:<26}{median_s * 1e3:>9.1f} ms  (min-max {min(seconds) * 1e3:.1f}-"
            f"{max(seconds) * 1e3:.1f})  vs unkeyed {median_s / plain:.3f}x"
        )


# --- runs -----------------------------------------------------------------------------------


def tagged(folder: Path) -> bool:
    """Whether the run under ``folder`` is authenticated: its manifest wears the envelope."""
    (manifest,) = folder.rglob(keys.manifest())
    return manifest.read_bytes().startswith(auth.MARKER)


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Count the Ed25519 signatures made and checked inside the block (per-node keys): the
    shell's ``nodekeys.verify`` and the signers ``nodekeys.signer`` makes, wrapped."""
    from gm_shell import nodekeys

    counts = {"signs": 0, "verifies": 0}
    real_verify, real_signer = nodekeys.verify, nodekeys.signer

    def verify(public: bytes, message: bytes, signature: bytes) -> bool:
        counts["verifies"] += 1
        return real_verify(public, message, signature)

    def signer(private: bytes) -> Callable[[bytes], bytes]:
        sign = real_signer(private)

        def counted(message: bytes) -> bytes:
            counts["signs"] += 1
            return sign(message)

        return counted

    nodekeys.verify, nodekeys.signer = verify, signer  # type: ignore[assignment]
    try:
        yield counts
    finally:
        nodekeys.verify, nodekeys.signer = real_verify, real_signer  # type: ignore[assignment]


LOOP_THREADS = "gm-loop"
"""How a session's event-loop thread's name begins (gm_shell.session): the core runs there."""


def _on_loop() -> bool:
    return threading.current_thread().name.startswith(LOOP_THREADS)


def _kind(key: str) -> str:
    """The kind of object at ``key`` (``snapshot``, ``round``, ``head``...)."""
    try:
        return type(keys.parse(key)).__name__.removesuffix("Key").lower()
    except keys.BadKey:
        return "other"


@contextlib.contextmanager
def envelope_clock() -> Iterator[dict[str, float]]:
    """CPU seconds spent inside ``Envelope.open`` and ``Envelope.seal`` (which ``pack``
    calls) on session loop threads within the block, by ``"open snapshot"``, ``"seal
    round"``...: the two methods wrapped alike on every side (an open run's are the no-op
    branch). CPU time (``time.thread_time``), not wall time: on a loaded machine a call's
    wall time is mostly the time its thread waited for a core, which the whole round's
    wall time shares alike."""
    spent: dict[str, float] = collections.defaultdict(float)
    real_open, real_seal = auth.Envelope.open, auth.Envelope.seal

    def clocked(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: auth.Envelope, key: str, data: bytes) -> Any:
            if not _on_loop():
                return real(self, key, data)
            started = time.thread_time()
            try:
                return real(self, key, data)
            finally:
                elapsed = time.thread_time() - started
                spent[f"{op} {_kind(key)}"] += elapsed

        return method

    auth.Envelope.open = clocked("open", real_open)  # type: ignore[method-assign]
    auth.Envelope.seal = clocked("seal", real_seal)  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        auth.Envelope.open, auth.Envelope.seal = real_open, real_seal  # type: ignore[method-assign]


@contextlib.contextmanager
def loop_cpu() -> Iterator[dict[str, float]]:
    """CPU seconds of each session loop thread that ends within the block, by thread name
    (read on the thread as its loop stops: ``time.thread_time``)."""
    from gm_shell import loopthread

    cpu: dict[str, float] = collections.defaultdict(float)
    real_run = loopthread.LoopThread._run

    def run(self: loopthread.LoopThread) -> None:
        try:
            real_run(self)
        finally:
            cpu[threading.current_thread().name] += time.thread_time()

    loopthread.LoopThread._run = run  # type: ignore[method-assign]
    try:
        yield cpu
    finally:
        loopthread.LoopThread._run = real_run  # type: ignore[method-assign]


def step_side(folder: Path, steps: int, side: str) -> dict[str, Any]:
    """``step()`` gaps on due steps (no commit waited for) of one run over ``file://``."""
    with counting() as signatures:
        (gaps, kinds), rounds = _gm_loop(folder, steps, side)
    due = [g for g, k in zip(gaps, kinds, strict=True) if k == "due"]
    figures = bench_step.summary(due) if due else {"median_us": None, "p99_us": None}
    return {
        **figures,
        **signatures,
        "due_steps": len(due),
        "rounds": rounds,
        "tagged": tagged(folder),
    }


def _gm_loop(folder: Path, steps: int, side: str) -> tuple[Any, int]:
    return bench_step.gm_loop(
        steps,
        8,
        2,
        0.01,
        0.01,
        mailbox=f"file://{folder}",
        run_key=RUN_KEYS[side],
        signed=side == "signed",
    )


def path_side(folder: Path, rounds: int, side: str, latency_ms: float) -> dict[str, Any]:
    """A closer's round over a ``LocalStore`` at ``latency_ms`` a request: round time,
    waves, requests per round; the loop thread's CPU and envelope time per round."""
    with counting() as signatures, envelope_clock() as spent, loop_cpu() as cpu:
        result = _critical_path(folder, rounds, side, latency_ms)
    row = result["results"][0]
    closer_cpu = [s for name, s in cpu.items() if name.endswith("closer")]
    return {
        "round_ms": row["round_s_median"] * 1e3,
        "waves": row["waves_median"],
        "requests_per_round": sum(row["requests_per_round"].values()),
        "by_class": row["requests_per_round"],
        "rounds_timed": row["rounds_timed"],
        "rounds": rounds,
        "loop_cpu_ms": sum(closer_cpu) * 1e3 / rounds if closer_cpu else None,
        "envelope_us": sum(spent.values()) * 1e6 / rounds,
        "envelope_parts_us": {part: s * 1e6 / rounds for part, s in sorted(spent.items())},
        "tagged": tagged(folder),
        **signatures,
    }


def _critical_path(folder: Path, rounds: int, side: str, latency_ms: float) -> dict[str, Any]:
    return gm_runs.critical_path(
        latencies_ms=[latency_ms],
        rounds=rounds,
        sync_every=8,
        fragments=2,
        tensors=8,
        elements=65536,
        run_key=RUN_KEYS[side],
        folder=folder,
        signed=side == "signed",
    )


def path_part(latency_ms: float) -> str:
    return f"path {latency_ms:g}ms"


def runs(
    repeat: int, steps: int, rounds: int, latencies_ms: list[float]
) -> dict[str, list[dict[str, Any]]]:
    """Each part's figures per repeat and side; the sides rotate which runs first."""
    parts = ["step", *(path_part(ms) for ms in latencies_ms)]
    out: dict[str, list[dict[str, Any]]] = {f"{p} {side}": [] for p in parts for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="gm-bench-auth-") as tmp:
        root = Path(tmp)
        for i in range(repeat):
            order = SIDES[i % len(SIDES) :] + SIDES[: i % len(SIDES)]  # who goes first rotates
            for side in order:
                where = root / f"step-{side}-{i}"
                out[f"step {side}"].append(step_side(where, steps, side))
            for ms in latencies_ms:
                for side in order:
                    where = root / f"path-{ms:g}ms-{side}-{i}"
                    where.mkdir()
                    out[f"{path_part(ms)} {side}"].append(path_side(where, rounds, side, ms))
    return out


def paired(per_side: dict[str, list[float]]) -> str:
    """keyed/open repeat by repeat (the two ran back to back): the median of those ratios
    and their quartiles, or nothing when a side lacks a sample or the open one is zero."""
    pairs = [k / o for o, k in zip(per_side["open"], per_side["keyed"], strict=False) if o]
    if len(pairs) < 2 or len(pairs) != len(per_side["open"]):
        return ""
    low, _, high = statistics.quantiles(pairs, n=4)
    return f"{statistics.median(pairs):.3f}x ({low:.3f}-{high:.3f})"


def print_runs(figures: dict[str, list[dict[str, Any]]], latencies_ms: list[float]) -> None:
    rows = [
        ("step", "median_us", "step() on due steps, median (us)"),
        ("step", "p99_us", "step() on due steps, p99 (us)"),
    ]
    for ms in latencies_ms:
        part = path_part(ms)
        rows += [
            (part, "round_ms", f"closer's round at {ms:g} ms, median (ms)"),
            (part, "loop_cpu_ms", "  its loop thread's CPU / round (ms)"),
            (part, "envelope_us", "  open+seal CPU on that thread / round (us)"),
            (part, "waves", "  sequential requests per round"),
            (part, "requests_per_round", "  requests per round (closer)"),
        ]
    print("\nOpen vs authenticated runs, file:// (median of repeats, min-max across repeats;")
    print("  signed: per-node keys on top of the run key)")
    head = "".join(f"{side:>9}{'spread':>17}" for side in SIDES)
    print(f"  {'':<36}{head}{'keyed/open':>12}{'signed/keyed':>14}{'keyed/open paired':>22}")
    for part, field, label in rows:
        per_side = {
            side: [r[field] for r in figures[f"{part} {side}"] if r.get(field) is not None]
            for side in SIDES
        }
        if not all(per_side.values()):
            print(f"  {label:<36}  (no samples)")
            continue
        med = {side: statistics.median(v) for side, v in per_side.items()}
        cells = "".join(
            f"{med[s]:>9.1f}{f'{min(v):.1f}-{max(v):.1f}':>17}" for s, v in per_side.items()
        )
        ratio = med["keyed"] / med["open"] if med["open"] else float("nan")
        signed = med["signed"] / med["keyed"] if med["keyed"] else float("nan")
        print(f"  {label:<36}{cells}{ratio:>11.3f}x{signed:>13.3f}x{paired(per_side):>22}")
    first = path_part(latencies_ms[0])
    print(f"\n  Envelope CPU on the closer's loop thread at {latencies_ms[0]:g} ms, us per round")
    print("  (median over repeats; every call of Envelope.open / .seal there, by object kind):")
    for side in SIDES:
        parts = collections.defaultdict(list)
        for r in figures[f"{first} {side}"]:
            for name, us in r["envelope_parts_us"].items():
                parts[name].append(us)
        cells = ", ".join(f"{n} {statistics.median(v):.1f}" for n, v in sorted(parts.items()))
        print(f"    {side}: {cells}")
    for part, what in ((first, "closer-only critical path"), ("step", "one-node step loop")):
        runs_ = figures[f"{part} signed"]
        signs = statistics.median(r["signs"] for r in runs_)
        verifies = statistics.median(r["verifies"] for r in runs_)
        rounds_ = statistics.median(r["rounds"] for r in runs_)
        print(
            f"  signed, {what}: {signs:.0f} signatures made and {verifies:.0f} checked "
            f"(median per run; the run commits about {rounds_:.0f} rounds)"
        )
    due = {side: sum(r["due_steps"] for r in figures[f"step {side}"]) for side in SIDES}
    print(
        "  due steps sampled (no commit waited for): "
        + ", ".join(f"{s} {n}" for s, n in due.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="repeats of every measurement")
    parser.add_argument("--only", choices=("hash", "runs"), help="run one part")
    parser.add_argument("--steps", type=int, default=400, help="training steps per step() run")
    parser.add_argument("--rounds", type=int, default=24, help="rounds per closer run")
    parser.add_argument(
        "--latency-ms",
        type=lambda text: [float(ms) for ms in text.split(",")],
        default=[0.0, 20.0],
        help="the store's latency per request for the closer's rounds (comma-separated ms)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; figures mean nothing")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    sizes = [2 << 10, 64 << 10, 64 << 20]
    payload_bytes = 64 << 20
    budget_s = 0.2
    if args.smoke:
        args.repeat, args.steps, args.rounds, args.latency_ms = 1, 40, 5, [0.0, 2.0]
        sizes, payload_bytes, budget_s = [2 << 10, 64 << 10], 1 << 20, 0.005
    started = time.monotonic()
    print(f"start: {load()}")
    result: dict[str, Any] = {}
    if args.only in (None, "hash"):
        result["hashing"] = hashing(sizes, args.repeat, budget_s)
        result["payload"] = payload_path(payload_bytes, args.repeat, budget_s)
        print_hashing(result["hashing"], result["payload"])
    if args.only in (None, "runs"):
        result["runs"] = runs(args.repeat, args.steps, args.rounds, args.latency_ms)
        print_runs(result["runs"], args.latency_ms)
    print(f"\nend: {load()}")
    print(f"(python {sys.version.split()[0]}, done in {time.monotonic() - started:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
