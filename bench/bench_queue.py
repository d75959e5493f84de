"""A shared queue against static ranks when half the learners are twice as slow (issue 13).

Run: ``.venv/bin/python bench/bench_queue.py [--units 96] [--batches 4] [--step-s 0.05]
[--repeats 1] [--in-flight 2] [--grace-seconds S] [--follow N] [--sim [--sim-latency-s S]
[--blocking]] [--json FILE] [--log FILE]``

Four learner processes (``both`` nodes, ``Session.run``) consume one dataset of ``--units``
units of ``--batches`` batches through a ``file://`` bucket; two take ``--step-s`` per step,
two twice that (each step paced to its deadline, as a device-bound step is). Each mode, in
turn in one run: ``queue`` (one ``SharedQueue``, prefetch 1: faster nodes take more units) and
``ranks`` (``Session(ranks=4)``: each rank trains the units ``i`` with ``i mod 4 == rank``).
Every node waits at a ``Barrier`` before its first step, so their starts line up. Printed per
mode: the time from the first step to the last step of any node (every process is on this
machine: one monotonic clock), the ideal speed-weighted time (the dataset's steps over the
four nodes' summed step rates, no sync cost), their ratio, the steps each node trained (fast,
slow, fast, slow), where each node's time went (``spent_s``: its start after the first node's,
in ``step``, in ``Session.step``, between steps besides, in ``want`` waiting for its next unit
— the queue's own work —, and its idle tail before the last node's last step; ``waits``: each
wait for a unit over 20 ms and whether the claim ahead had begun), ``over_paced_ideal`` (the
ideal at the pace each node's ``step`` really kept), the nodes' eval loss at the end (a linear
student of a fixed teacher, the model each node holds after ``close()``: the newest commit
when it closed), and the run's final committed model, read from the bucket once every process
exited (``final_loss``, the same for both modes), with what its tape holds (``tape``: per
fragment the steps and tokens merged, against the dataset's; the final snapshots; the last
rounds' participants ``learner:steps[F]@base``). ``--trajectory`` also polls the committed
model's loss per round while the run goes; the loss oscillates with the round under the
default outer step (Nesterov 0.7/0.9), so the final loss of a split is mostly where it stopped
in that oscillation (bench/README.md, session 15); ``--outer-lr 1 --outer-momentum 0`` removes
it.

``--sim`` runs the simulator side instead (:mod:`gm_core.sim`: the real closer and learner
machines on a virtual clock, four ``both`` nodes, the first two twice as slow, the same
``DiLoCo`` options, every request taking ``--sim-latency-s``): one simulated run records
when each learner's every step ended, stalls included, and :mod:`gm_core.sim.consume`
reads from it how long the dataset takes pulled from a queue and split into static ranks,
against the same ideal, and the floor any split has on those trajectories
(``floor_over_ideal``: when the learners' steps first add up to the dataset's, the protocol's
stalls included, no queue cost). The queue's own requests: :data:`BEHIND_REQUESTS_PER_UNIT` per
unit sent in the background while the unit trains (``Session.run``'s consumer), delaying
the next unit only by what the unit's training does not cover, and
:data:`FIRST_UNIT_REQUESTS` before the first unit; with ``--blocking``, the consumer before
it claimed ahead: :data:`QUEUE_REQUESTS_PER_UNIT` on the training thread at every unit's
boundary. The loss is the committed model's (a small MLP the simulator trains) at each
split's end time. ``--repeats`` runs that many seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

NODES = 4
IN, OUT = 16, 4
QUEUE_REQUESTS_PER_UNIT = 5.5
"""``--blocking``: the queue's requests on the training thread at a unit's boundary, prefetch
1, as the consumer sent them before it claimed ahead: before its done marker a LIST of the
unit, the marker (PUT) and the claims' DELETE; before the next unit a LIST of it; every
second unit also the queue's LIST and two claims (PUT)."""
BEHIND_REQUESTS_PER_UNIT = 5
"""The queue's requests in the background while a unit trains, prefetch 1: the previous
unit's done marker (a LIST of it, the PUT; the claims' DELETE runs beside them), then the
claim ahead (the queue's LIST, one PUT: no body read while untouched units are left) and
its check (a LIST of the unit). Near the end, with no untouched unit left, the claim ahead
also reads the bodies peers wrote: not modelled."""
FIRST_UNIT_REQUESTS = 5
"""Before the first unit, on the training thread: the units statement (PUT), the queue's
LIST, two claims (PUT), the check of the first (LIST)."""


def _teacher() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(IN, OUT)).astype(np.float32)


def worker(spec: dict[str, Any]) -> None:
    """One node: train its share, print its step times and final loss as one JSON line."""
    import logging

    import torch

    logging.basicConfig(level=logging.INFO, format=f"{spec['node']} %(asctime)s %(message)s")

    from gm_shell import DiLoCo, Session, SessionOptions, SharedQueue

    torch.manual_seed(0)
    model = torch.nn.Linear(IN, OUT)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    teacher = torch.from_numpy(_teacher())
    algorithm = DiLoCo(
        sync_every=8,
        fragments=2,
        quorum=1,
        in_flight=spec["in_flight"],
        lease_timeout_s=4.0,
        grace_seconds=spec["grace_seconds"],
        follow=spec["follow"],
        outer_lr=spec["outer_lr"],
        outer_momentum=spec["outer_momentum"],
    )
    options = SessionOptions(poll_s=0.05, close_timeout_s=60.0, join_timeout_s=120.0)
    times: list[float] = []
    steps: list[None] = []
    spent = dict.fromkeys(("work", "session_step", "between", "want"), 0.0)
    waits: list[tuple[float, bool]] = []
    """Each ``want`` of a unit over 20 ms: how long, and whether the claim ahead had begun."""
    """Where this node's time from its first step to its last went: in ``step`` (the
    batch's work and sleep), in ``Session.step`` (pacing: stalls on commits), and between
    steps besides (the queue's claims, listings and done markers at a unit's end; the next
    rank batch's generator)."""

    def batches(unit: str) -> Any:
        rng = np.random.default_rng(int(unit[1:]))
        for _ in range(spec["batches"]):
            yield torch.from_numpy(rng.normal(size=(8, IN)).astype(np.float32))

    def step(x: Any) -> int:
        entered = time.monotonic()
        if not times:
            times.append(entered)
        else:
            spent["between"] += entered - times[-1]
        loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # Paced to a deadline, as a device-bound step is: the host's share of the step
        # (torch here, gm's background thread) hides under the wait while it fits.
        time.sleep(max(0.0, entered + spec["step_s"] - time.monotonic()))
        times[1:] = [time.monotonic()]
        spent["work"] += times[-1] - entered
        steps.append(None)
        return 8

    units = [f"u{i:03d}" for i in range(spec["units"])]
    ranks = NODES if spec["mode"] == "ranks" else None
    session = Session(
        model,
        algorithm=algorithm,
        mailbox=spec["url"],
        node=spec["node"],
        options=options,
        ranks=ranks,
        run_key=None,
    )
    real_step = session.step

    last_call = [0.0]

    def timed_step(**counted: int) -> None:
        entered = time.monotonic()
        real_step(**counted)
        last_call[0] = time.monotonic() - entered
        spent["session_step"] += last_call[0]

    session.step = timed_step  # type: ignore[method-assign]  # Session.run calls self.step
    real_want = session._want

    def timed_want(consumer: Any, data: Any) -> Any:
        entered = time.monotonic()
        behind = consumer._behind
        begun = behind is None or behind.done() or getattr(consumer, "_ahead_began", False)
        got = real_want(consumer, data)
        took = time.monotonic() - entered
        if times and got is not None:  # after the first step, before the last
            spent["want"] += took
            if took > 0.02:
                waits.append((round(took, 3), bool(begun)))
        return got

    session._want = timed_want  # type: ignore[method-assign]
    with session:
        with session.barrier("start", parties=NODES) as barrier:
            barrier.wait()
        if ranks is None:
            session.run(step, SharedQueue(units, batches, prefetch=1))
        else:
            mine = [u for i, u in enumerate(units) if i % NODES == session.rank]
            session.run(step, (x for u in mine for x in batches(u)))
    loss = _eval_loss(model)
    # A node may train nothing (a tiny dataset taken by faster peers before its first step).
    first, last = (times[0], times[-1]) if times else (None, None)
    got = {"first": first, "last": last, "loss": loss, "steps": len(steps)}
    got |= {"round": -1 if session.checkpoint is None else session.checkpoint.round}
    got |= {"finished": session.finished}
    spent["between"] -= spent["session_step"] - last_call[0]  # the last call ends no gap
    spent["between"] -= spent["want"]
    print(json.dumps({**got, "spent": spent, "waits": waits}))


def _eval_loss(model: Any) -> float:
    import torch

    x = torch.from_numpy(np.random.default_rng(99).normal(size=(256, IN)).astype(np.float32))
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), x @ torch.from_numpy(_teacher())))


def final_model(url: str) -> dict[str, Any]:
    """The run's final committed model, read from the bucket once every process exited (the
    same for both modes), and what its tape holds: per fragment, the tokens of the snapshots
    merged into a commit (each step's tokens enter each fragment's deltas once) and their
    steps; the rounds committed, the last round that merged a final (flush) snapshot, and
    the final snapshots merged."""
    import asyncio

    import torch

    from gm_core import auth
    from gm_core.records import RoundRecord
    from gm_shell import align
    from gm_shell.mailbox import Mailbox
    from gm_shell.run import read_manifest
    from gm_shell.tapereads import read_record

    torch.manual_seed(0)
    model = torch.nn.Linear(IN, OUT)
    checkpoint = align(model, mailbox=url, run_key=None)

    async def tape() -> list[RoundRecord]:
        box = Mailbox.open(url)
        try:
            manifest = await read_manifest(box, None)
            assert manifest is not None
            envelope = auth.of_run(manifest, None)
            records: list[RoundRecord] = []
            while True:
                got = (await read_record(box, envelope, manifest.config, len(records))).record
                if not isinstance(got, RoundRecord):
                    return records
                records.append(got)
        finally:
            box.close()

    records = asyncio.run(tape())
    tokens: dict[int, int] = {}
    steps: dict[int, int] = {}
    finals = [(r.round, p.learner) for r in records for p in r.participants if p.final]
    for r in records:
        tokens[r.fragment] = tokens.get(r.fragment, 0) + sum(p.tokens for p in r.participants)
        steps[r.fragment] = steps.get(r.fragment, 0) + sum(p.steps for p in r.participants)
    return {
        "final_loss": round(_eval_loss(model), 5),
        "final_round": checkpoint.round,
        "tape": {
            "rounds": len(records),
            "tokens_per_fragment": [tokens[f] for f in sorted(tokens)],
            "steps_per_fragment": [steps[f] for f in sorted(steps)],
            "final_snapshots": len(finals),
            "last_final_round": max((r for r, _ in finals), default=None),
            "last_rounds": [
                [r.round, r.fragment, r.version]
                + [
                    f"{p.learner}:{p.steps}{'F' if p.final else ''}@{p.base_version}"
                    for p in r.participants
                ]
                + [f"{x.learner}:{x.reason}" for x in r.rejections]
                for r in records[-8:]
            ],
        },
    }


class _Watch:
    """``--trajectory``: the committed model's loss as the run goes, read with ``align``
    every 0.2 s by a thread of the bench process (rounds and losses, each round once)."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.seen = url, dict[int, float]()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        import torch

        from gm_shell import align

        model = torch.nn.Linear(IN, OUT)
        while not self.halt.wait(0.2):
            try:
                got = align(model, mailbox=self.url, run_key=None)
            except Exception:  # no run yet, or a payload swept under the read
                continue
            self.seen.setdefault(got.round, round(_eval_loss(model), 4))

    def stop(self) -> list[tuple[int, float]]:
        self.halt.set()
        self.thread.join()
        return sorted(self.seen.items())


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    logs = args.log or Path(os.devnull)
    with tempfile.TemporaryDirectory() as folder, logs.open("a") as log:
        url = f"file://{folder}/bucket"
        procs = []
        for n in range(NODES):
            step_s = args.step_s * (2 if n % 2 else 1)
            spec = {"url": url, "node": f"n{n}", "mode": mode, "step_s": step_s}
            spec |= {"units": args.units, "batches": args.batches, "in_flight": args.in_flight}
            spec |= {"grace_seconds": args.grace_seconds, "follow": args.follow}
            spec |= {"outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum}
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env={**os.environ},
                )
            )
        watch = _Watch(url) if args.trajectory else None
        outs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"{mode}: a node exited {proc.returncode}")
            outs.append(json.loads(out.splitlines()[-1]))
        trajectory = watch.stop() if watch is not None else None
        final = final_model(url)
    steps = args.units * args.batches
    nominal = [1 / (args.step_s * (2 if n % 2 else 1)) for n in range(NODES)]
    ideal_s = steps / sum(nominal)
    trained = [o for o in outs if o["steps"]]
    first, last = min(o["first"] for o in trained), max(o["last"] for o in trained)
    took_s = last - first
    losses = sorted(o["loss"] for o in outs)
    # Per node: when it started after the first node, its time in steps, between steps and
    # between units, and how long before the end it had nothing left (the tail).
    spent = [
        {
            "start": round(o["first"] - first, 2) if o["steps"] else None,
            **{k: round(v, 2) for k, v in o["spent"].items()},
            "tail": round(last - o["last"], 2) if o["steps"] else None,
            "waits": o["waits"],
        }
        for o in outs
    ]
    # The same ideal at the pace each node's ``step`` really kept (under load a step takes
    # longer than its sleep: no split of the data can win that back); a node that trained
    # nothing at its nominal pace.
    paced = [o["steps"] / o["spent"]["work"] if o["steps"] else 0.0 for o in outs]
    paced_s = steps / sum(p or r for p, r in zip(paced, nominal, strict=True))
    return {
        "mode": mode,
        "took_s": round(took_s, 2),
        "ideal_s": round(ideal_s, 2),
        "over_ideal": round(took_s / ideal_s, 3),
        "over_paced_ideal": round(took_s / paced_s, 3),
        "loss": [round(v, 5) for v in losses],
        **final,
        "rounds_at_close": [o["round"] for o in outs],
        "finished": [o["finished"] for o in outs],
        "steps_fast_slow": [outs[n]["steps"] for n in range(NODES)],
        "spent_s": spent,
        **({"trajectory": trajectory} if trajectory is not None else {}),
    }


def simulate(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """The simulator side: one simulated run, read as both splits of the dataset."""
    from gm_core.sim import consume, experiments, world
    from gm_core.sim.scenario import TrainingSpec

    step_s = {n: args.step_s * 2 if n < NODES // 2 else args.step_s for n in range(NODES)}
    ideal = args.units * args.batches / sum(1 / s for s in step_s.values())
    scenario = experiments.two_speed_fleet(
        step_s=args.step_s,
        duration_s=4 * ideal + 10.0,
        in_flight=args.in_flight,
        grace_seconds=args.grace_seconds,
        follow=args.follow,
        latency_s=args.sim_latency_s,
        seed=seed,
        training=TrainingSpec(),
    )
    report = world.run(scenario)
    ends, steps = report.step_ends, report.step_s
    latency_s = args.sim_latency_s
    if args.blocking:
        queue = consume.pulled(
            ends, steps, args.units, args.batches, QUEUE_REQUESTS_PER_UNIT * latency_s
        )
    else:
        queue = consume.pulled(
            ends,
            steps,
            args.units,
            args.batches,
            behind_s=BEHIND_REQUESTS_PER_UNIT * latency_s,
            first_s=FIRST_UNIT_REQUESTS * latency_s,
        )
    split = {"queue": queue, "ranks": consume.static(ends, steps, args.units, args.batches)}
    origin = consume.start_s(ends, steps)
    # The floor of any split on these trajectories: when the learners' steps, the protocol's
    # stalls in them, first add up to the dataset's (no unit boundaries, no queue requests).
    merged = sorted(t for e in ends.values() for t in e)
    needed = args.units * args.batches
    floor_s = merged[needed - 1] - origin if len(merged) >= needed else float("inf")
    rows = []
    for mode, got in split.items():
        if got is None:
            raise SystemExit(f"sim: the simulated run ended before the dataset ({mode})")
        losses = [loss for t, _, loss in report.summary.losses if t <= origin + got.took_s]
        rows.append(
            {
                "mode": f"sim {mode}",
                "seed": seed,
                "took_s": round(got.took_s, 2),
                "ideal_s": round(ideal, 2),
                "over_ideal": round(got.took_s / ideal, 3),
                "floor_over_ideal": round(floor_s / ideal, 3),
                "loss": [round(losses[-1], 5)] if losses else [],
                "steps_slow_slow_fast_fast": [
                    got.units[n] * args.batches for n in sorted(got.units)
                ],
                "records": report.summary.records,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=96)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument(
        "--grace-seconds", type=float, help="a fixed grace window (default: the adaptive one)"
    )
    parser.add_argument("--follow", type=int, default=0, help="DiLoCo(follow=N)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo(outer_lr=...)")
    parser.add_argument(
        "--outer-momentum", type=float, default=0.9, help="DiLoCo(outer_momentum=...)"
    )
    parser.add_argument("--sim", action="store_true", help="the simulator side instead")
    parser.add_argument(
        "--sim-latency-s", type=float, default=0.005, help="with --sim: every request's median"
    )
    parser.add_argument(
        "--blocking",
        action="store_true",
        help="with --sim: the queue's requests between units, on the training thread",
    )
    parser.add_argument(
        "--trajectory", action="store_true", help="also poll the committed model's loss"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--log", type=Path, help="append the nodes' logs here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.sim:
        rows = [row for seed in range(args.repeats) for row in simulate(args, seed)]
        for row in rows:
            print(json.dumps(row), flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps({"sim": rows}))
        return
    figures: dict[str, list[dict[str, Any]]] = {"queue": [], "ranks": []}
    for _ in range(args.repeats):
        for mode, rows in figures.items():
            rows.append(run_mode(mode, args))
            print(json.dumps(rows[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
