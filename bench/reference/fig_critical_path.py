"""Figure 2, reference side: a closer's round time under injected per-request latency.

The closer's critical path, isolated: a run is created and every round's snapshots (four
learners, all accepted) are written into the mailbox beforehand, so the closer never waits
for a learner. A ``gradientmail.syncer.Syncer`` then closes ``--rounds`` rounds back to
back through a metered mailbox that sleeps ``latency`` before every request. The time
between consecutive commits is the round time; the requests on its critical path are
counted two ways:

- ``waves``: within one round's interval, a new wave starts at a request that begins after
  every earlier request of the round has ended (requests that overlap run in parallel);
- ``slope``: (round time at L − round time at 0) / L.

``commit_waves`` counts the waves from the end of the merge to the record write alone (the
requests between the round's quorum and its commit, as its grace window is zero here).

Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time

from gradientmail import DiLoCo, MemoryMailbox
from gradientmail.events import RoundClosed, RoundCommitted
from gradientmail.syncer import Syncer
from journal import Journal, by_class, waves
from numpy_adapter import NumpyBackend
from refkit import LEARNERS, MeteredMailbox, emit, model_arrays, prefilled_run


def measure(args: argparse.Namespace, latency_s: float) -> dict[str, object]:
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments)
    init = model_arrays(args.tensors, args.elements)
    store = MemoryMailbox()
    asyncio.run(prefilled_run(store, algorithm, init, args.rounds))
    journal = Journal()
    commits: list[tuple[int, float]] = []

    closes: dict[int, float] = {}

    def on_event(event: object) -> None:
        if isinstance(event, RoundCommitted):
            commits.append((event.record.round, time.perf_counter()))
        elif isinstance(event, RoundClosed):
            # Emitted once the merge is done, before the first write of the commit.
            closes[event.draft.round] = time.perf_counter()

    syncer = Syncer(
        algorithm=algorithm,
        mailbox=MeteredMailbox(store, node="closer", journal=journal, latency_s=latency_s),
        node_id="closer",
        backend=NumpyBackend(),
        poll_interval=args.poll,
        on_event=on_event,
    )
    asyncio.run(syncer.run(until_round=args.rounds - 1))
    requests = journal.snapshot()
    # Skip the first rounds (recovery at start, a cold fragment state) and time the rest.
    steady = commits[2:]
    intervals, round_waves, windows = [], [], []
    for (_, t0), (_, t1) in itertools.pairwise(steady):
        inside = [r for r in requests if t0 < r.started and r.ended <= t1]
        intervals.append(t1 - t0)
        round_waves.append(waves(inside))
        windows.append(inside)
    rounds = len(intervals)
    # From the merge's end to the record write: the commit's requests alone.
    commit_waves = [
        waves([r for r in requests if closes[rnd] <= r.started and r.ended <= t])
        for rnd, t in steady
        if rnd in closes
    ]
    return {
        "commit_waves_median": statistics.median(commit_waves),
        "latency_ms": latency_s * 1e3,
        "rounds_timed": rounds,
        "round_s_median": statistics.median(intervals),
        "round_s_mean": statistics.fmean(intervals),
        "waves_median": statistics.median(round_waves),
        "requests_per_round": {
            k: v / rounds for k, v in by_class(r for w in windows for r in w).items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0, 50.0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--poll", type=float, default=0.05, help="seconds (never waited here)")
    parser.add_argument("--sync-every", type=int, default=120)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--elements", type=int, default=65536)
    args = parser.parse_args()
    results = [measure(args, ms / 1e3) for ms in args.latency_ms]
    base = next((r for r in results if r["latency_ms"] == 0.0), None)
    for r in results:
        if base is not None and r["latency_ms"] > 0:
            r["slope_requests"] = (r["round_s_median"] - base["round_s_median"]) / (
                r["latency_ms"] / 1e3
            )
    emit(
        {
            "ok": True,
            "runtime": "gradientmail.syncer.Syncer alone, snapshots prefilled, numpy adapter",
            "learners": len(LEARNERS),
            "fragment_bytes": args.tensors // args.fragments * args.elements * 4,
            "sync_every": args.sync_every,
            "fragments": args.fragments,
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
