"""Figure 5, reference side: what ``Session.run`` adds to each training step when no round is due.

One ``gradientmail.Session`` (role "both", default poll interval) over the in-memory mailbox
runs ``--steps`` steps of a training function that does nothing but read the clock. With
``sync_every`` far beyond the run, no round falls due: the per-step cost is the session's
bookkeeping (``Learner.step``: counters, draining the inbox of commits, the due-round check)
plus its loop. Measured as the gap between one step's return and the next step's call; the
same gap for a bare ``for`` loop over the same function is reported beside it. Prints JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gradientmail import DiLoCo, MemoryAdapter, MemoryMailbox, Session
from numpy_adapter import NumpyBackend, tensors_of
from refkit import emit, model_arrays


def gaps_ns(enter: list[int], leave: list[int]) -> list[int]:
    return [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]


def summary(gaps: list[int]) -> dict[str, float]:
    ordered = sorted(gaps)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3

    return {
        "median_us": statistics.median(ordered) / 1e3,
        "mean_us": statistics.fmean(ordered) / 1e3,
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--elements", type=int, default=4096)
    args = parser.parse_args()

    enter: list[int] = []
    leave: list[int] = []

    def step(_batch: int) -> int:
        enter.append(time.perf_counter_ns())
        leave.append(time.perf_counter_ns())
        return 1

    session = Session(
        MemoryAdapter(tensors_of(model_arrays(args.tensors, args.elements))),
        algorithm=DiLoCo(sync_every=10**9, fragments=4),
        mailbox=MemoryMailbox(),
        node_id="solo",
        backend=NumpyBackend(),
        callbacks=(),
    )
    session.join()
    session.run(step, range(args.steps))
    with_session = gaps_ns(enter, leave)

    enter.clear()
    leave.clear()
    for batch in range(args.steps):
        step(batch)
    bare = gaps_ns(enter, leave)

    emit(
        {
            "ok": True,
            "what": "gap between consecutive step() calls inside Session.run, no round due",
            "steps": args.steps,
            "session": summary(with_session),
            "bare_loop": summary(bare),
        }
    )


if __name__ == "__main__":
    main()
