"""gm next to the reference package gradientmail 0.0.2: the same scenarios, ratios in one run.

Run (after ``make install`` and ``bash bench/setup_reference.sh``)::

    .venv/bin/python bench/compare.py                 # every figure, about 2-3 minutes
    .venv/bin/python bench/compare.py --only 1 2      # some figures
    .venv/bin/python bench/compare.py --json out.json # also keep the raw figures

The reference side runs in ``bench/.venv-ref`` (Python 3.12) as subprocesses, one script
of ``bench/reference/`` per figure, each printing JSON; when that venv is missing or broken
the comparison says why and prints gm's figures alone. ``bench/README.md`` explains every
figure and holds the tables of the last recorded run.

How gm's side is measured
-------------------------
Until gm's Session runtime lands, gm's figures 1-3 come from gm's own core:
``gm_core.cluster`` interprets the learner and closer machines' commands against the model
store, and a timed scheduler here (``GmSim``) drives it on a virtual clock: every node's
timers fire when they ask, learners step at a fixed step time, and every command completes
``latency`` after it was issued. Store commands are counted as the requests they are on S3
(a LIST per page of 1000 keys, a DELETE per batch of 1000, a HEAD billed as a GET);
payload commands are counted as the requests the runtime (``gm_shell.runtime``) makes for
them: ``Capture`` one PUT; ``Verify`` one GET unless the node has the payload cached;
``Align`` one GET unless the node wrote or read that commit itself; ``Merge`` a GET for a
base theta and one for a base momentum the node does not hold, then the theta and momentum
PUTs in parallel. Every table says which measurement it used.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from gm_core import cluster as cl
from gm_core import codec, keys
from gm_core.closer import CloserOptions
from gm_core.closer import Phase as CloserPhase
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Get,
    List,
    Merge,
    Notify,
    Probe,
    PutOnce,
    PutOver,
    Verify,
)
from gm_core.learner import LearnerOptions
from gm_core.numerics import Contributions, Layout
from gm_core.records import AlgorithmConfig, MergeRule, PayloadRef, Snapshot, TensorSpec
from gm_core.tape import BadRecord, parse_record
from gm_shell.accounting import PRICES_S3, RequestClass, Stats, cost_usd

BENCH = Path(__file__).resolve().parent
REF_PYTHON = BENCH / ".venv-ref" / "bin" / "python"
REF_SCRIPTS = BENCH / "reference"
CLASSES = ("LIST", "GET", "PUT", "DELETE")
LEARNER, CLOSER = cl.Machine.LEARNER, cl.Machine.CLOSER
LIST_PAGE_KEYS = 1000
DELETE_BATCH_KEYS = 1000
ROUNDS_PER_DAY_AT_30_S = 24 * 3600 / 30
TIMER_TICK_S = 1e-3
"""Virtual time a timer re-armed for the past waits before it fires again (see GmSim._fire)."""
MAX_SPINS = 50_000


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


# --- gm's side: the core's machines on a virtual clock ------------------------------------------


@attrs.frozen
class Req:
    """One store request gm's shell would send: when, by which node, of which class."""

    t: float
    node: str
    cls: str
    count: int
    category: str


Wave = tuple[tuple[str, str], ...]
"""Requests sent together, as (class, category) pairs; a command's waves run one after another."""


def category_of(key: str) -> str:
    return key.split("/", 1)[0]


class LivelockError(RuntimeError):
    """The machines keep issuing commands at one instant of virtual time."""


class GmSim:
    """Drives a ``gm_core.cluster.Cluster`` on a virtual clock and meters its requests.

    ``settle`` does everything due at the current instant (deliver finished commands, fire
    timers, take training steps) until nothing is left; ``run_until`` then jumps the clock to
    the next instant anything is due. A command issued at ``t`` finishes at ``t + waves ×
    latency_s`` (plus ``merge_s`` for a merge): its requests, wave after wave.
    """

    def __init__(self, c: cl.Cluster, *, latency_s: float = 0.0, merge_s: float = 0.0) -> None:
        self.c = c
        self.latency_s = latency_s
        self.merge_s = merge_s
        self.due: dict[cl.InFlight, tuple[float, int, tuple[Wave, ...]]] = {}
        self.seq = 0
        self.log: list[Req] = []
        self.cache: dict[str, set[str]] = defaultdict(set)
        self.trainers: dict[str, float] = {}
        self.next_step_at: dict[str, float] = {}
        self.commits: list[tuple[int, float, str]] = []
        self.notes: list[tuple[float, str, Notify]] = []
        self.feeder: Callable[[GmSim], None] | None = None
        self.spins: Counter[str] = Counter()
        self.merges: dict[int, float] = {}
        """When each round's merge was asked for: the closer's quorum (grace is zero here)."""

    @property
    def now(self) -> float:
        return self.c.now_s

    def start(self, name: str, *, step_s: float | None = None) -> None:
        self.c = cl.start(self.c, name)
        if step_s is not None:
            self.trainers[name] = step_s
            self.next_step_at[name] = self.now + step_s

    def crash(self, name: str) -> None:
        self.c = cl.crash(self.c, name)
        self.trainers.pop(name, None)
        self.cache.pop(name, None)

    # -- what a command costs ----------------------------------------------------------------

    def _waves(self, item: cl.InFlight) -> tuple[Wave, ...]:
        cmd: Command = item.command
        store = self.c.store
        held = self.cache[item.node]

        def pages(n: int, size: int) -> int:
            return max(1, math.ceil(n / size))

        if isinstance(cmd, Get | Probe):
            return ((("GET", category_of(cmd.key)),),)
        if isinstance(cmd, PutOnce | PutOver):
            return ((("PUT", category_of(cmd.key)),),)
        if isinstance(cmd, List):
            n = len(store.list(cmd.prefix, cmd.offset))
            return ((("LIST", category_of(cmd.prefix)),),) * pages(n, LIST_PAGE_KEYS)
        if isinstance(cmd, Delete):
            batches = math.ceil(len(cmd.keys) / DELETE_BATCH_KEYS)
            return ((("DELETE", category_of(cmd.keys[0])),),) * batches if cmd.keys else ()
        if isinstance(cmd, DeletePrefix):
            n = len(store.list(cmd.prefix))
            where = category_of(cmd.prefix)
            listing = ((("LIST", where),),) * pages(n, LIST_PAGE_KEYS)
            return listing + ((("DELETE", where),),) * math.ceil(n / DELETE_BATCH_KEYS)
        if isinstance(cmd, Capture):
            return ((("PUT", "payloads"),),)
        if isinstance(cmd, Verify):
            return () if cmd.payload.key in held else ((("GET", "payloads"),),)
        if isinstance(cmd, Align):
            return () if cmd.theta.key in held else ((("GET", "payloads"),),)
        if isinstance(cmd, Merge):
            waves: list[Wave] = []
            if cmd.base.theta.key not in held:
                waves.append((("GET", "payloads"),))
            if cmd.base.momentum is not None and cmd.base.momentum.key not in held:
                waves.append((("GET", "payloads"),))
            missing = [x for x in cmd.contributions if x.payload.key not in held]
            if missing:
                waves.append((("GET", "payloads"),) * len(missing))
            waves.append((("PUT", "payloads"),) * (1 if cmd.final_only else 2))
            return tuple(waves)
        raise TypeError(f"no request model for {cmd!r}")

    def _remember_reads(self, item: cl.InFlight) -> None:
        cmd, held = item.command, self.cache[item.node]
        if isinstance(cmd, Verify):
            held.add(cmd.payload.key)
        elif isinstance(cmd, Align):
            held.add(cmd.theta.key)
        elif isinstance(cmd, Merge):
            held.add(cmd.base.theta.key)
            if cmd.base.momentum is not None:
                held.add(cmd.base.momentum.key)

    # -- the scheduler --------------------------------------------------------------------------

    def _register(self) -> None:
        live = set(self.c.inflight)
        for stale in [i for i in self.due if i not in live]:
            del self.due[stale]
        for item in self.c.inflight:
            if item not in self.due:
                waves = self._waves(item)
                extra = 0.0
                if isinstance(item.command, Merge):
                    extra = self.merge_s
                    self.merges[item.command.round] = self.now
                self.due[item] = (self.now + len(waves) * self.latency_s + extra, self.seq, waves)
                self.seq += 1

    def _deliver(self, item: cl.InFlight) -> None:
        _, _, waves = self.due.pop(item)
        for wave in waves:
            for cls, category in wave:
                self.log.append(Req(self.now, item.node, cls, 1, category))
        self._remember_reads(item)
        cmd = item.command
        record_key = (
            cmd.key if isinstance(cmd, PutOnce) and cmd.key.startswith(keys.ROUNDS_PREFIX) else None
        )
        existed = record_key is not None and self.c.store.get(record_key) is not None
        self.c = cl.deliver(self.c, self.c.inflight.index(item))
        if record_key is not None and not existed:
            got = self.c.store.get(record_key)
            if got is not None:
                record = parse_record(got.data, int(record_key.split("/")[1].split(".")[0]))
                if not isinstance(record, BadRecord):
                    self.commits.append((record.round, self.now, item.node))
                    self.cache[item.node].add(record.theta.key)
                    if record.outer is not None:
                        self.cache[item.node].add(record.outer.key)

    def _fire(self, name: str, machine: cl.Machine) -> None:
        """Fire a timer. A machine that re-arms it for an instant already past would spin: an
        event loop would run it again a moment later, so the re-armed timer fires
        ``TIMER_TICK_S`` later here (and the spin is counted in ``spins``)."""
        self.c = cl.fire(self.c, name, machine)
        node = self.c.nodes[name]
        at = node.timers.get(machine)
        if at is not None and at <= self.now:
            self.spins[f"{name}/{machine}"] += 1
            if sum(self.spins.values()) > MAX_SPINS:
                raise LivelockError(
                    f"gm's machines re-armed their timers for the past {MAX_SPINS} times "
                    f"(by t={self.now:g} s): {dict(self.spins.most_common(3))}"
                )
            timers = {**node.timers, machine: self.now + TIMER_TICK_S}
            nodes = {**self.c.nodes, name: attrs.evolve(node, timers=timers)}
            self.c = attrs.evolve(self.c, nodes=nodes)

    def _train(self) -> bool:
        trained = False
        for name, step_s in self.trainers.items():
            while self.next_step_at[name] <= self.now:
                if cl.can_train(self.c, name):
                    self.c = cl.train(self.c, name, 1)
                    self.next_step_at[name] += step_s
                    trained = True
                else:
                    self.next_step_at[name] = self.now + step_s
                    break
        return trained

    def settle(self, limit: int = 200_000) -> None:
        recent: Counter[str] = Counter()
        for spin in range(limit):
            if self.feeder is not None:
                self.feeder(self)
            self._register()
            ready = [
                (due, seq, item) for item, (due, seq, _) in self.due.items() if due <= self.now
            ]
            if ready:
                item = min(ready, key=lambda r: (r[0], r[1]))[2]
                if spin >= limit - 1000:
                    recent[f"{item.node}/{item.machine}: {type(item.command).__name__}"] += 1
                self._deliver(item)
                continue
            timers = cl.due_timers(self.c)
            if timers:
                for name, machine in timers:
                    self._fire(name, machine)
                continue
            if self._train():
                continue
            for name, note in self.c.notes[len(self.notes) :]:
                self.notes.append((self.now, name, note))
            return
        raise LivelockError(
            f"gm's machines never settled at t={self.now:g} s: {limit} steps at one instant, "
            f"the last 1000 mostly {dict(recent.most_common(4))}"
        )

    def _next_time(self) -> float | None:
        times = [due for due, _, _ in self.due.values()]
        timer = cl.next_timer_s(self.c)
        if timer is not None:
            times.append(timer)
        times.extend(self.next_step_at[n] for n in self.trainers)
        later = [t for t in times if t > self.now]
        return min(later, default=None)

    def run_until(self, done: Callable[[], bool], t_max: float) -> bool:
        while True:
            self.settle()
            if done():
                return True
            nxt = self._next_time()
            if nxt is None or nxt > t_max:
                return False
            self.c = attrs.evolve(self.c, now_s=nxt)

    def committed(self, round_: int) -> bool:
        return any(r >= round_ for r, _, _ in self.commits)

    def run_until_round(self, round_: int, t_max: float) -> bool:
        return self.run_until(lambda: self.committed(round_), t_max)

    def noted(self, name: str, kind: str) -> bool:
        return any(n == name and note.kind == kind for _, n, note in self.notes)


def schema(tensors: int, elements: int) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(name=f"layer{i:02d}.weight", shape=(elements,), dtype="F32")
        for i in range(tensors)
    )


def requests_by_class(log: Iterable[Req]) -> dict[str, int]:
    counts = Counter(dict.fromkeys(CLASSES, 0))
    for r in log:
        counts[r.cls] += r.count
    return dict(counts)


def requests_by_object(log: Iterable[Req]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for r in log:
        table.setdefault(r.category, Counter())[r.cls] += r.count
    return {cat: dict(counts) for cat, counts in sorted(table.items())}


def prefill_feeder(
    learners: tuple[str, ...], rounds: int, ahead: int = 2
) -> Callable[[GmSim], None]:
    """Keeps every round's snapshots in the store ``ahead`` rounds before the closer needs them.

    Written straight into the model store, as ``learners`` would publish them: payload first,
    then the snapshot record, with the fragment's current version as base and zero step time
    (so the grace window stays closed). These writes are the learners', not counted.
    """
    state = {"next": 0}

    def feed(sim: GmSim) -> None:
        committed = max((r for r, _, _ in sim.commits), default=-1)
        cfg = sim.c.manifest.config
        store = sim.c.store
        while state["next"] < rounds and state["next"] <= committed + ahead:
            round_ = state["next"]
            for learner in learners:
                data = cl.payload_bytes("delta", learner, round_)
                digest = cl.digest_of(data)
                ref = PayloadRef(key=keys.payload(round_, digest), size=len(data), digest=digest)
                store, _ = store.put_once(ref.key, data)
                snapshot = Snapshot(
                    learner=learner,
                    round=round_,
                    fragment=round_ % cfg.fragments,
                    base_version=round_ // cfg.fragments,
                    steps=cfg.sync_every // cfg.fragments,
                    tokens=256 * (cfg.sync_every // cfg.fragments),
                    step_s=0.0,
                    schema_digest=sim.c.schema_digest,
                    payload=ref,
                )
                store, _ = store.put_once(keys.snapshot(round_, learner), codec.encode(snapshot))
            state["next"] += 1
        sim.c = attrs.evolve(sim.c, store=store)

    return feed


# --- figure 1: requests and cost per round ------------------------------------------------------


def gm_requests(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return _gm_requests(args)
    except LivelockError as error:
        return {"error": str(error)}
    except Exception as error:  # the core is young: report, and go on with the other figures
        return {"error": f"gm's model failed: {type(error).__name__}: {error}"}


def _gm_requests(args: argparse.Namespace) -> dict[str, Any]:
    round_s = args.sync_every // args.fragments * args.step
    # gm's default takeover floor (10 s) is shorter than this scenario's first round (30 s),
    # which has no timing estimates yet: followers would take round 0 over. Three rounds, as
    # the core's own timeout once estimates exist (3 x a round).
    config = AlgorithmConfig(
        sync_every=args.sync_every, fragments=args.fragments, takeover_floor_s=3 * round_s
    )
    names = [f"node-{i}" for i in range(args.nodes)]
    c = cl.create(
        config,
        {n: frozenset({LEARNER, CLOSER}) for n in names},
        schema=schema(8, 4096),
        learner_options=LearnerOptions(poll_s=args.poll),
        closer_options=CloserOptions(poll_s=args.poll),
    )
    sim = GmSim(c)
    for name in names:
        sim.start(name, step_s=args.step)
    last = args.rounds
    ok = sim.run_until_round(last, t_max=(last + 10) * round_s * 4)
    times = {r: t for r, t, _ in sim.commits}
    if not ok or 1 not in times:
        return {"error": f"gm's cluster committed only {len(sim.commits)} rounds"}
    t0, t1 = times[1], times[last]
    rounds = last - 1
    window = [r for r in sim.log if t0 < r.t <= t1]
    records = [rec for rec in cl.records(sim.c) if 1 < rec.round <= last]
    return {
        "runtime": "modelled: gm_core.cluster machines on a virtual clock (GmSim)",
        "window": [1, last],
        "window_rounds": rounds,
        "round_s": (t1 - t0) / rounds,
        "per_round": {k: v / rounds for k, v in requests_by_class(window).items()},
        "per_round_by_object": {
            cat: {cls: n / rounds for cls, n in counts.items()}
            for cat, counts in requests_by_object(window).items()
        },
        "participants_per_round": sum(len(r.participants) for r in records) / max(len(records), 1),
        "quorum": config.quorum,
        "in_flight": config.in_flight,
        "takeover_floor_s": config.takeover_floor_s,
    }


def gm_requests_real(args: argparse.Namespace) -> dict[str, Any]:
    """Figure 1 with gm's real runtime: ``args.nodes`` Sessions sharing one ``memory://`` bucket.

    Each node (role both) trains a small torch model in a thread of its own; time is scaled as
    on the reference side (every protocol second lasts ``args.scale`` s: polls, steps, lease
    renewals, lease timeout, takeover floor). Requests are each session's own mailbox meter,
    read whenever a round commits; the window runs from round 1's commit to the last commit
    before the first node stops training.
    """
    if importlib.util.find_spec("gm_shell.session") is None:
        return {"error": "gm_shell.session does not exist yet"}
    try:
        import torch

        from gm_shell.session import DiLoCo, Session, SessionOptions
    except Exception as error:
        return {"error": f"gm_shell.session does not import: {type(error).__name__}: {error}"}
    import threading
    import uuid

    scale = args.scale
    round_s = args.sync_every // args.fragments * args.step
    steps = (args.rounds + 2) * (args.sync_every // args.fragments)
    algorithm = DiLoCo(
        sync_every=args.sync_every,
        fragments=args.fragments,
        lease_timeout_s=30.0 * scale,
        takeover_floor_s=3 * round_s * scale,
    )
    options = SessionOptions(
        poll_s=args.poll * scale,
        stall_timeout_s=120.0,
        join_timeout_s=120.0,
        close_timeout_s=30.0,
        compute="numpy",
    )
    url = f"memory://gm-bench-{uuid.uuid4().hex[:8]}/run"
    sessions: dict[str, Any] = {}
    commits: list[tuple[int, float, int, dict[str, Stats]]] = []
    stopped: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def on_event(event: Any) -> None:
        if getattr(event, "kind", "") == "committed":
            with lock:
                stats = {name: s.stats for name, s in sessions.items()}
                commits.append((event.round, time.monotonic(), event.participants, stats))

    def node(name: str) -> None:
        torch.manual_seed(0)
        model = torch.nn.Module()
        for i in range(8):
            model.register_parameter(f"layer{i:02d}", torch.nn.Parameter(torch.randn(4096) * 0.02))
        try:
            session = Session(
                model,
                algorithm=algorithm,
                mailbox=url,
                node=name,
                options=options,
                callbacks=(on_event,),
            )
            with lock:
                sessions[name] = session
            with session:
                for _ in range(steps):
                    time.sleep(args.step * scale)
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 1e-3)
                    session.step(samples=256)
                with lock:
                    stopped.append(time.monotonic())
        except Exception as error:
            failures.append(f"{name}: {type(error).__name__}: {error}")

    names = [f"node-{i}" for i in range(args.nodes)]
    threads = [threading.Thread(target=node, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    end = min(stopped, default=math.inf)
    steady = sorted((r, t, n, st) for r, t, n, st in commits if r >= 1 and t <= end)
    if len(steady) < 3:
        why = "; ".join(failures) or f"{len(commits)} commits"
        return {"error": f"gm's real runtime: too few rounds in the steady state ({why})"}
    (r0, t0, _, s0), (r1, t1, _, s1) = steady[0], steady[-1]
    rounds = r1 - r0
    delta = Stats()
    for name in names:
        if name in s0 and name in s1:
            delta = delta + (s1[name] - s0[name])
    per_round = {cls: delta.requests(RequestClass(cls)) / rounds for cls in CLASSES}
    return {
        "runtime": "real: gm_shell Session x4 (role both), one memory:// bucket, torch model",
        "failures": failures,
        "scale": scale,
        "window": [r0, r1],
        "window_rounds": rounds,
        "round_s": (t1 - t0) / rounds / scale,
        "per_round": per_round,
        "participants_per_round": statistics.fmean(n for _, _, n, _ in steady[1:]),
        "retries_per_round": delta.retries / rounds,
    }


def cost_of(per_round: dict[str, float]) -> float:
    stats = Stats(
        list_requests=round(per_round["LIST"] * 1000),
        get_requests=round(per_round["GET"] * 1000),
        put_requests=round(per_round["PUT"] * 1000),
        delete_requests=round(per_round["DELETE"] * 1000),
    )
    return cost_usd(stats, PRICES_S3) / 1000


def figure_requests(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    modelled = gm_requests(args)
    real = gm_requests_real(args)
    gm = real if "per_round" in real else modelled
    ref = (
        reference(
            "fig_requests.py",
            *("--nodes", str(args.nodes), "--poll", str(args.poll), "--step", str(args.step)),
            *("--sync-every", str(args.sync_every), "--fragments", str(args.fragments)),
            *("--rounds", str(args.rounds), "--scale", str(args.scale)),
        )
        if ref_ok
        else {"error": "skipped"}
    )
    print(
        f"\nFigure 1. Store requests and S3 request cost per round: {args.nodes} nodes "
        f"(learner + closer each), poll {args.poll:g} s, step {args.step:g} s, "
        f"H={args.sync_every}, P={args.fragments}: a round every "
        f"{args.sync_every // args.fragments * args.step:g} s"
    )
    print(f"  gm:        {gm.get('runtime', gm.get('error'))}")
    if gm is modelled and "error" in real:
        print(f"             (the real runtime could not be measured: {real['error']})")
    print(f"  reference: {ref.get('runtime', ref.get('error'))}")
    if "scale" in ref:
        print(
            f"             (time scaled x{ref['scale']:g}: "
            f"a protocol second lasts {ref['scale']:g} s)"
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
    if gm is real and "per_round" in modelled:
        counts = ", ".join(f"{cls} {modelled['per_round'][cls]:.1f}" for cls in CLASSES)
        print(
            f"  cross-check, gm modelled (GmSim, unscaled virtual time): {counts}; "
            f"${cost_of(modelled['per_round']):.5f} per round"
        )
    objects(modelled, ref)
    return {"gm": gm, "gm_modelled": modelled, "gm_real": real, "reference": ref}


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
        name = "gm (modelled)" if label == "gm" else label
        print(f"  {name} by object: " + "; ".join(parts))


# --- figure 2: round time under latency, the critical path ---------------------------------------


def gm_merge_seconds(elements: int, contributions: int, repeat: int = 7) -> float:
    """Best time of gm's numpy merge_step (+ cosine) on one fragment of ``elements`` floats."""
    from gm_shell.backends import NumpyBackend

    rng = np.random.default_rng(3)
    backend = NumpyBackend()
    layout = Layout.of([("fragment", (elements,))])
    deltas = [rng.standard_normal(elements).astype(np.float32) for _ in range(contributions)]
    theta = rng.standard_normal(elements).astype(np.float32)
    momentum = np.zeros(elements, dtype=np.float32)
    who = Contributions(
        learners=tuple(f"l{i}" for i in range(contributions)),
        weights=tuple(1.0 + i for i in range(contributions)),
    )
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        backend.merge_step(deltas, who, layout, MergeRule.MEAN, "embed", theta, momentum, 0.7, 0.9)
        backend.cosine(deltas)
        best = min(best, time.perf_counter() - t0)
    return best


def closer_only_cluster(rounds_fragments: tuple[int, int], quorum: int) -> cl.Cluster:
    sync_every, fragments = rounds_fragments
    config = AlgorithmConfig(sync_every=sync_every, fragments=fragments, quorum=quorum)
    roles = {
        "closer": frozenset({CLOSER}),
        "successor": frozenset({CLOSER}),
        "joiner": frozenset({LEARNER}),
    }
    return cl.create(config, roles, schema=schema(8, 16))


LEARNERS = ("learner-a", "learner-b", "learner-c", "learner-d")


def gm_critical_path(args: argparse.Namespace, merge_s: float) -> dict[str, Any]:
    try:
        return _gm_critical_path(args, merge_s)
    except LivelockError as error:
        return {"error": str(error)}
    except Exception as error:  # the core is young: report, and go on with the other figures
        return {"error": f"gm's model failed: {type(error).__name__}: {error}"}


def _gm_critical_path(args: argparse.Namespace, merge_s: float) -> dict[str, Any]:
    results = []
    for latency_ms in args.latency_ms:
        c = closer_only_cluster((args.sync_every, args.fragments), quorum=len(LEARNERS))
        sim = GmSim(c, latency_s=latency_ms / 1e3, merge_s=merge_s)
        sim.feeder = prefill_feeder(LEARNERS, args.path_rounds)
        sim.start("closer")
        last = args.path_rounds - 1
        sim.run_until_round(last, t_max=3600)
        times = [t for _, t, _ in sorted(sim.commits)][2:]
        intervals = [b - a for a, b in itertools.pairwise(times)]
        if not intervals:
            return {"error": f"gm's closer committed {len(sim.commits)} rounds"}
        window = [r for r in sim.log if times[0] < r.t <= times[-1]]
        median = statistics.median(intervals)
        row: dict[str, Any] = {
            "latency_ms": latency_ms,
            "round_s_median": median,
            "requests_per_round": {
                k: v / len(intervals) for k, v in requests_by_class(window).items()
            },
        }
        if latency_ms > 0:
            row["sequential_requests"] = (median - merge_s) / (latency_ms / 1e3)
            after_quorum = [
                (t - sim.merges[r] - merge_s) / (latency_ms / 1e3)
                for r, t, _ in sim.commits[2:]
                if r in sim.merges
            ]
            row["quorum_to_record"] = statistics.median(after_quorum)
        row["timer_spins"] = dict(sim.spins)
        results.append(row)
    return {
        "runtime": "modelled: gm_core closer machine on a virtual clock, merge time measured",
        "merge_s": merge_s,
        "results": results,
    }


def figure_critical_path(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    elements = 8 // args.fragments * 65536
    merge_s = gm_merge_seconds(elements, len(LEARNERS))
    gm = gm_critical_path(args, merge_s)
    ref = (
        reference(
            "fig_critical_path.py",
            "--latency-ms",
            *(f"{ms:g}" for ms in args.latency_ms),
            *("--rounds", str(args.path_rounds), "--elements", "65536"),
            *("--sync-every", str(args.sync_every), "--fragments", str(args.fragments)),
        )
        if ref_ok
        else {"error": "skipped"}
    )
    print(
        "\nFigure 2. A closer's round time under injected per-request latency: 4 learners' "
        "snapshots already in the store, the closer alone closes round after round "
        f"(fragment of {elements * 4 // 1024} KiB, 4 contributions)"
    )
    print(f"  gm:        {gm.get('runtime', gm.get('error'))}")
    print(f"             merge_step + cosine, numpy backend: {merge_s * 1e3:.2f} ms per round")
    print(f"  reference: {ref.get('runtime', ref.get('error'))}")
    gm_rows = {r["latency_ms"]: r for r in gm.get("results", [])}
    ref_rows = {r["latency_ms"]: r for r in ref.get("results", [])}
    rows = []
    for ms in args.latency_ms:
        g, r = gm_rows.get(ms, {}), ref_rows.get(ms, {})
        label = f"{ms:g} ms per request" + (" (gm: merge only)" if ms == 0 else "")
        rows.append((label, g.get("round_s_median"), r.get("round_s_median")))
    table(["round time (s)", "gm", "reference", "ref/gm"], rows, ratio="b/a", fmt="{:.4f}")
    seq_rows = []
    for ms in args.latency_ms:
        if ms <= 0:
            continue
        g, r = gm_rows.get(ms, {}), ref_rows.get(ms, {})
        seq_rows.append(
            (f"at {ms:g} ms (slope)", g.get("sequential_requests"), r.get("slope_requests"))
        )
        seq_rows.append((f"at {ms:g} ms (waves)", None, r.get("waves_median")))
        seq_rows.append(
            (
                "  of which quorum -> record",
                g.get("quorum_to_record"),
                r.get("commit_waves_median"),
            )
        )
    table(["sequential requests", "gm", "reference", "ref/gm"], seq_rows, ratio="b/a", fmt="{:.1f}")
    worst = max((ms for ms in args.latency_ms), default=0.0)
    g, r = gm_rows.get(worst, {}), ref_rows.get(worst, {})
    if g.get("round_s_median") and r.get("round_s_median"):
        speedup = r["round_s_median"] / g["round_s_median"]
        verdict = "met" if speedup >= 3 else "NOT met"
        print(f"  goal: >= 3x faster at {worst:g} ms: {verdict} ({speedup:.1f}x)")
    return {"gm": gm, "reference": ref}


# --- figure 3: joining and taking over after many rounds -----------------------------------------


def gm_join(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return _gm_join(args)
    except LivelockError as error:
        return {"error": str(error)}
    except Exception as error:  # the core is young: report, and go on with the other figures
        return {"error": f"gm's model failed: {type(error).__name__}: {error}"}


def _gm_join(args: argparse.Namespace) -> dict[str, Any]:
    c = closer_only_cluster((args.sync_every, args.fragments), quorum=1)
    sim = GmSim(c)
    sim.feeder = prefill_feeder(("learner-a",), args.join_rounds)
    sim.start("closer")
    last = args.join_rounds - 1
    if not sim.run_until_round(last, t_max=10**7):
        return {"error": f"gm's closer committed {len(sim.commits)} rounds"}
    sim.feeder = None
    result: dict[str, Any] = {
        "runtime": "modelled: gm_core learner and closer machines on a virtual clock",
        "rounds": len(sim.commits),
    }

    # Join: a new learner, from its start to its first step (the shell reads the manifest
    # first: one GET the core does not see, added here).
    sim.latency_s = args.join_latency_ms / 1e3
    mark, t0 = len(sim.log), sim.now
    sim.start("joiner")
    sim.run_until(lambda: sim.noted("joiner", "joined"), t_max=sim.now + 600)
    joined = [r for r in sim.log[mark:] if r.node == "joiner"]
    result["join"] = {
        "requests": add_manifest_get(requests_by_class(joined)),
        "by_object": requests_by_object(joined),
        "seconds_at_latency": sim.now - t0 + sim.latency_s,
        "sequential_at_latency": (sim.now - t0) / sim.latency_s + 1,
        "latency_ms": args.join_latency_ms,
    }

    # Takeover: the closer dies; a successor boots (finds the newest record), follows until
    # the dead closer's lease goes stale, claims the round, and reloads the fragments' state.
    sim.latency_s = 0.0
    sim.crash("closer")
    mark = len(sim.log)
    sim.start("successor")
    sim.run_until(lambda: _phase(sim, "successor") is not CloserPhase.BOOTING, t_max=sim.now + 600)
    booted = len(sim.log)
    sim.run_until(lambda: sim.noted("successor", "took_over"), t_max=sim.now + 600)
    mine = [r for r in sim.log[mark:] if r.node == "successor"]
    boot = [r for r in sim.log[mark:booted] if r.node == "successor"]
    claim = [r for r in sim.log[booted:] if r.node == "successor" and r.category == "claims"]
    waiting = [r for r in sim.log[booted:] if r.node == "successor" and r.category != "claims"]
    rebuild = add_manifest_get(requests_by_class(boot + claim))
    # The successor holds no tensors: each fragment's first merge reads its theta and momentum
    # (GmSim counts them as they come; all P fragments are listed here to match a full reload).
    rebuild["GET"] += 2 * args.fragments
    result["takeover"] = {
        "requests": rebuild,
        "boot": requests_by_class(boot),
        "claim": requests_by_class(claim),
        "waiting_polls": requests_by_class(waiting),
        "all": requests_by_class(mine),
        "waited_s": sim.now - sim.log[booted - 1].t if booted else None,
    }
    result["timer_spins"] = dict(sim.spins)
    return result


def _phase(sim: GmSim, name: str) -> CloserPhase | None:
    node = sim.c.nodes[name]
    return node.closer.phase if node.closer is not None else None


def add_manifest_get(counts: dict[str, int]) -> dict[str, int]:
    return {**counts, "GET": counts["GET"] + 1}


def figure_join(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    gm = gm_join(args)
    ref = (
        reference(
            "fig_join.py",
            *("--rounds", str(args.join_rounds), "--latency-ms", f"{args.join_latency_ms:g}"),
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
        f"  reference: {ref.get('error') or 'Learner.join() and Syncer.recover(), numpy adapter'}"
    )
    rows = []
    for what, label in (("join", "join (to first step)"), ("takeover", "takeover (state rebuild)")):
        g = gm.get(what, {}).get("requests")
        r = ref.get(what, {}).get("requests")
        rows.append((label, sum(g.values()) if g else None, sum(r.values()) if r else None))
        for cls in ("LIST", "GET", "PUT"):
            rows.append((f"  {cls}", g[cls] if g else None, r[cls] if r else None))
    table(["requests", "gm", "reference", "ref/gm"], rows, ratio="b/a", fmt="{:.0f}")
    gj, rj = gm.get("join", {}), ref.get("join", {})
    lat = args.join_latency_ms
    table(
        [f"join at {lat:g} ms/request", "gm", "reference", "ref/gm"],
        [
            ("sequential requests", gj.get("sequential_at_latency"), rj.get("waves_at_latency")),
            ("seconds", gj.get("seconds_at_latency"), rj.get("wall_s_at_latency")),
        ],
        ratio="b/a",
        fmt="{:.2f}",
    )
    tk = gm.get("takeover", {})
    if tk:
        polls = tk["waiting_polls"]
        print(
            "  gm takeover detail: boot "
            f"{sum(tk['boot'].values())} requests, claim {sum(tk['claim'].values())}, "
            f"then per-poll waiting while the lease goes stale: {polls}"
        )
    return {"gm": gm, "reference": ref}


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


def gm_merge(
    arrays: dict[str, Any], rule: MergeRule, backend_name: str, repeat: int
) -> dict[str, Any]:
    from gm_shell.backends import backend as make_backend

    names = [str(n) for n in arrays["names"]]
    k = len(arrays["tokens"])
    layout = Layout.of([(n, arrays[f"theta/{n}"].shape) for n in names])
    flat = {key: np.ascontiguousarray(v).reshape(-1) for key, v in arrays.items() if "/" in key}
    be = make_backend(backend_name)
    deltas = [be.asarray(np.concatenate([flat[f"delta{i}/{n}"] for n in names])) for i in range(k)]
    theta0 = np.concatenate([flat[f"theta/{n}"] for n in names])
    momentum0 = np.concatenate([flat[f"momentum/{n}"] for n in names])
    weights = tuple(
        float(t) * float(t) / float(s)
        for t, s in zip(arrays["tokens"], arrays["steps"], strict=True)
    )
    who = Contributions(learners=tuple(f"learner-{i}" for i in range(k)), weights=weights)
    best_step = best_both = float("inf")
    theta = momentum = None
    for _ in range(repeat):
        theta, momentum = be.asarray(theta0.copy()), be.asarray(momentum0.copy())
        t0 = time.perf_counter()
        be.merge_step(deltas, who, layout, rule, "embed", theta, momentum, 0.7, 0.9)
        t1 = time.perf_counter()
        be.cosine(deltas)
        t2 = time.perf_counter()
        best_step, best_both = min(best_step, t1 - t0), min(best_both, t2 - t0)
    assert theta is not None
    assert momentum is not None
    n = layout.total
    return {
        "best_s": best_step,
        "best_s_with_cosine": best_both,
        "delta_gb_per_s": k * n * 4 / best_step / 1e9,
        "delta_gb_per_s_with_cosine": k * n * 4 / best_both / 1e9,
        "theta": be.to_numpy(theta).copy(),
        "momentum": be.to_numpy(momentum).copy(),
        "names": names,
        "layout": layout,
    }


def figure_merge(args: argparse.Namespace, ref_ok: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gm-bench-") as tmp:
        inputs = Path(tmp) / "fragment.npz"
        arrays = merge_inputs(inputs, args.merge_mib, args.contributions)
        print(
            f"\nFigure 4. Merge + outer step on one fragment of {args.merge_mib} MiB "
            f"(4 tensors), {args.contributions} contributions; GB/s of deltas merged "
            f"({args.contributions} x {args.merge_mib} MiB per round), best of {args.repeat}"
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
            sides = {"numpy": gm_merge(arrays, rule, "numpy", args.repeat)}
            if importlib.util.find_spec("torch") is not None:
                sides["torch"] = gm_merge(arrays, rule, "torch", args.repeat)
            agreement = None
            if "error" not in ref and ref_out.exists():
                agreement = agree(sides["numpy"], np.load(ref_out))
            ref_rate = ref.get("delta_gb_per_s")
            rows: list[tuple[str, float | None, float | None]] = []
            for name, side in sides.items():
                rows.append((f"gm {name} merge_step", side["delta_gb_per_s"], ref_rate))
                rows.append(
                    (f"gm {name} merge_step + cosine", side["delta_gb_per_s_with_cosine"], ref_rate)
                )
            print(f"  merge rule: {rule.value}")
            if "error" in ref:
                print(f"  reference: {ref['error']}")
            else:
                took = ref["best_s"] * 1e3
                print(f"  reference: {ref['what']} over our numpy adapter: {took:.1f} ms")
            table(["GB/s of deltas", "gm", "reference", "gm/ref"], rows, ratio="a/b", fmt="{:.2f}")
            if agreement is not None:
                print(
                    "  same inputs, same result: max |gm - ref| / max |ref| = "
                    f"theta {agreement['theta']:.1e}, momentum {agreement['momentum']:.1e}"
                )
            out[rule.value] = {
                "gm": {
                    name: {k: v for k, v in side.items() if k.startswith(("best", "delta"))}
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
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval, seconds")
    parser.add_argument("--step", type=float, default=1.0, help="training step, seconds")
    parser.add_argument("--sync-every", type=int, default=120, help="H")
    parser.add_argument("--fragments", type=int, default=4, help="P")
    parser.add_argument("--rounds", type=int, default=10, help="figure 1: rounds per node")
    parser.add_argument("--scale", type=float, default=0.1, help="figure 1: reference time scale")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0, 50.0])
    parser.add_argument("--path-rounds", type=int, default=10, help="figure 2: rounds timed")
    parser.add_argument("--join-rounds", type=int, default=1000)
    parser.add_argument("--join-latency-ms", type=float, default=50.0)
    parser.add_argument("--merge-mib", type=int, default=16)
    parser.add_argument("--contributions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20000, help="figure 5: steps timed")
    args = parser.parse_args()
    figures = set(args.only or range(1, 6))

    status = reference_status()
    print("gm vs gradientmail 0.0.2 (the reference)")
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
