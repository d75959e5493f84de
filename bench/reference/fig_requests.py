"""Figure 1, reference side: store requests per round of a 4-node run.

Four ``gradientmail.Session``s (role "both", the default: each trains and takes part in
closing rounds) share one in-memory mailbox, each through its own metered wrapper, and
train a small model through our numpy adapter. Time is scaled: every protocol second (poll
interval, training step, lease period, and the per-request latency ``--latency-ms`` the
metered mailbox sleeps) lasts ``--scale`` real seconds, so a round of
``sync_every / fragments`` one-second steps at one-second polls runs 30 polls long as it
would at full scale, in a tenth of the time. Requests per round depend on polls per round,
which the scaling keeps.

The steady-state window runs from the commit of round 1 (after the run is created and every
node has joined) to the last commit before the first node runs out of data. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import numpy as np
from gradientmail import DiLoCo, MemoryAdapter, MemoryMailbox, Session
from gradientmail.clock import MonotonicClock
from gradientmail.protocol import Exchange
from journal import Journal, by_category, by_class
from numpy_adapter import NumpyBackend, from_f32, tensors_of, to_f32
from refkit import MeteredMailbox, emit, model_arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.1, help="real seconds per protocol s")
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval, protocol s")
    parser.add_argument("--step", type=float, default=1.0, help="training step, protocol s")
    parser.add_argument("--sync-every", type=int, default=120)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10, help="rounds each node trains for")
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--elements", type=int, default=4096)
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="per request, protocol ms (scaled too)"
    )
    args = parser.parse_args()

    gap = args.sync_every // args.fragments
    steps = (args.rounds + 2) * gap
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments)
    store = MemoryMailbox()
    journal = Journal()
    init = model_arrays(args.tensors, args.elements)
    failures: list[str] = []
    start = time.perf_counter()

    def node(index: int) -> None:
        name = f"node-{index}"
        adapter = MemoryAdapter(tensors_of(init))
        rng = np.random.default_rng(100 + index)

        def train(_batch: int) -> int:
            time.sleep(args.step * args.scale)
            adapter.apply(
                {
                    key: from_f32(
                        to_f32(t)
                        + rng.standard_normal(t.shape[0]).astype(np.float32) * np.float32(1e-3),
                        "F32",
                    )
                    for key, t in adapter.tensors.items()
                }
            )
            return 256

        session = Session(
            adapter,
            algorithm=algorithm,
            mailbox=MeteredMailbox(
                store, node=name, journal=journal, latency_s=args.latency_ms / 1e3 * args.scale
            ),
            node_id=name,
            poll_interval=args.poll * args.scale,
            backend=NumpyBackend(),
            # The reference's defaults (60 s and 120 s), on the scaled clock.
            lease_every=60.0 * args.scale,
            lease_timeout=120.0 * args.scale,
            callbacks=(),
        )
        try:
            session.run(train, range(steps))
        except BaseException as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=node, args=(i,), name=f"ref-node-{i}", daemon=True)
        for i in range(args.nodes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    elapsed = time.perf_counter() - start
    requests = journal.snapshot()

    commits = sorted(
        (int(r.key.split("/")[1].split(".")[0]), r.ended)
        for r in requests
        if r.category == "rounds" and r.cls == "PUT" and r.created
    )
    done_at = min((r.ended for r in requests if r.category == "done"), default=float("inf"))
    steady = [(rnd, t) for rnd, t in commits if rnd >= 1 and t <= done_at]
    if len(steady) < 3:
        emit({"error": f"too few rounds committed in the steady state: {steady}", "ok": False})
        return
    (first_round, t0), (last_round, t1) = steady[0], steady[-1]
    rounds = last_round - first_round
    window = [r for r in requests if t0 < r.ended <= t1]
    records = asyncio.run(Exchange(store, clock=MonotonicClock()).rounds_after(-1))
    in_window = [rec for rec in records if first_round < rec.round <= last_round]
    round_s = (t1 - t0) / rounds
    emit(
        {
            "ok": not failures,
            "failures": failures,
            "runtime": "gradientmail.Session x4 (role both), MemoryMailbox, numpy adapter",
            "nodes": args.nodes,
            "poll_s": args.poll,
            "step_s": args.step,
            "scale": args.scale,
            "latency_ms": args.latency_ms,
            "sync_every": args.sync_every,
            "fragments": args.fragments,
            "quorum": algorithm.quorum_size,
            "in_flight": algorithm.in_flight,
            "lease_every_s": 60.0,
            "rounds_committed": len(commits),
            "window_rounds": rounds,
            "window": [first_round, last_round],
            "round_s": round_s / args.scale,
            "polls_per_round": round_s / (args.poll * args.scale),
            "per_round": {k: v / rounds for k, v in by_class(window).items()},
            "per_round_by_object": {
                cat: {cls: n / rounds for cls, n in counts.items()}
                for cat, counts in by_category(window).items()
            },
            "participants_per_round": (
                sum(len(rec.participants) for rec in in_window) / max(len(in_window), 1)
            ),
            "elapsed_real_s": elapsed,
        }
    )


if __name__ == "__main__":
    main()
