"""What ``Session.step()`` adds to a training step: with no round due, and with rounds due.

Run: ``.venv/bin/python -m bench.bench_step [--steps 20000] [--due-steps 2000] [--step-ms 1]``

The figure is the gap between one training call's return and the next one's start,
in microseconds (median, p90, p99, mean), for the loop
``for batch in data: train(batch); session.step(samples=1)`` — so it is exactly
what the session adds, and a bare loop over the same ``train`` is shown beside it.

* **No round due**: ``train`` does nothing; ``sync_every`` is far beyond the run. gm's
  ``step()`` is then an increment and a compare (the core told the shell the next step
  at which anything can happen).
* **Rounds due**: a tiny model (8 tensors of 4096 floats, 128 KiB), H=8 and P=2, so a
  round falls due every 4 steps; ``train`` sleeps ``--step-ms`` (a stand-in for a
  training step that releases the GIL, as torch's kernels do). One node is learner and
  closer over ``memory://``, polling every ``--poll-ms``: on due steps ``step()`` reports
  to the loop thread, copies the fragment's delta and hands it over, and on the steps
  after a commit it folds the commit in; the closer merges and commits meanwhile. A
  quarter of the steps are due, so p90 and p99 are due steps; they include the GIL
  handoffs with the loop thread (whose Python work holds the GIL for 0.1-0.7 ms per
  event) and, with ``in_flight`` 2, any wait for a commit that fell behind.

The reference package (``gradientmail`` 0.0.2) runs the same loops inside its
``Session.run`` when ``bench/.venv-ref`` exists (``bash bench/setup_reference.sh``);
its figures print beside gm's. The issue quoted 8.5 µs (no round due) and 12.7 µs
(rounds due) for it on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REFERENCE_PYTHON = HERE / ".venv-ref" / "bin" / "python"


def summary(gaps_ns: list[int]) -> dict[str, float]:
    ordered = sorted(gaps_ns)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3

    return {
        "median_us": statistics.median(ordered) / 1e3,
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
        "mean_us": statistics.fmean(ordered) / 1e3,
    }


def timed_train(step_s: float) -> tuple[Callable[[int], None], list[int], list[int]]:
    """A training function that records when it starts and ends, and sleeps ``step_s``."""
    enter: list[int] = []
    leave: list[int] = []

    def train(_batch: int) -> None:
        enter.append(time.perf_counter_ns())
        if step_s:
            time.sleep(step_s)
        leave.append(time.perf_counter_ns())

    return train, enter, leave


def gaps(enter: list[int], leave: list[int]) -> list[int]:
    return [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]


def gm_loop(
    steps: int, sync_every: int, fragments: int, step_s: float, poll_s: float
) -> dict[str, float]:
    import torch

    from gm_shell import DiLoCo, Session, SessionOptions

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64, bias=False) for _ in range(8)))
    session = Session(
        model,
        algorithm=DiLoCo(sync_every=sync_every, fragments=fragments, in_flight=2),
        mailbox="memory://",
        node="solo",
        options=SessionOptions(poll_s=poll_s, compute="numpy"),
    )
    train, enter, leave = timed_train(step_s)
    with session:
        for batch in range(steps):
            train(batch)
            session.step(samples=1)
        rounds = session.round
    result = summary(gaps(enter, leave))
    result["rounds_committed"] = rounds + 1
    return result


def bare_loop(steps: int, step_s: float) -> dict[str, float]:
    train, enter, leave = timed_train(step_s)
    for batch in range(steps):
        train(batch)
    return summary(gaps(enter, leave))


REFERENCE_CODE = """
import json, sys, time
sys.path.insert(0, {refdir!r})
from gradientmail import DiLoCo, MemoryAdapter, MemoryMailbox, Session
from numpy_adapter import NumpyBackend, tensors_of
from refkit import model_arrays
enter, leave = [], []
def step(_batch):
    enter.append(time.perf_counter_ns())
    if {step_s!r}:
        time.sleep({step_s!r})
    leave.append(time.perf_counter_ns())
    return 1
session = Session(
    MemoryAdapter(tensors_of(model_arrays(8, 4096))),
    algorithm=DiLoCo(sync_every={sync_every!r}, fragments={fragments!r}),
    mailbox=MemoryMailbox(), node_id="solo", backend=NumpyBackend(), callbacks=(),
)
session.join()
session.run(step, range({steps!r}))
print(json.dumps([enter[i + 1] - leave[i] for i in range(len(enter) - 1)]))
"""


def reference_loop(
    steps: int, sync_every: int, fragments: int, step_s: float
) -> dict[str, float] | str:
    """The reference's Session.run over the same loop, or why it could not run."""
    if not REFERENCE_PYTHON.exists():
        return "bench/.venv-ref is missing (bash bench/setup_reference.sh)"
    code = REFERENCE_CODE.format(
        refdir=str(HERE / "reference"),
        steps=steps,
        sync_every=sync_every,
        fragments=fragments,
        step_s=step_s,
    )
    try:
        done = subprocess.run(
            [str(REFERENCE_PYTHON), "-c", code],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        return summary(json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError) as error:
        return f"reference failed: {type(error).__name__}: {str(error)[:300]}"


def table(title: str, gm: dict[str, float], ref: dict[str, float] | str, bare: Any) -> None:
    print(f"\n{title}")
    if isinstance(ref, str):
        print(f"  reference: {ref}")
    print(f"  {'us per step':<16}{'gm':>10}{'reference':>12}{'ref/gm':>9}{'bare loop':>12}")
    for key in ("median_us", "p90_us", "p99_us", "mean_us"):
        theirs = ref[key] if isinstance(ref, dict) else float("nan")
        ratio = theirs / gm[key] if gm[key] > 0 else float("nan")
        label = key.removesuffix("_us")
        print(f"  {label:<16}{gm[key]:>10.2f}{theirs:>12.2f}{ratio:>8.1f}x{bare[key]:>12.2f}")
    if "rounds_committed" in gm:
        print(f"  gm rounds committed during the run: {gm['rounds_committed']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000, help="no-round-due steps")
    parser.add_argument("--due-steps", type=int, default=1000, help="steps with rounds due")
    parser.add_argument("--step-ms", type=float, default=10.0, help="sleep per step, rounds due")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="gm poll, rounds due")
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    step_s = args.step_ms / 1e3
    started = time.monotonic()

    def ref(steps: int, sync_every: int, fragments: int, s: float) -> dict[str, float] | str:
        if args.no_reference:
            return "skipped (--no-reference)"
        return reference_loop(steps, sync_every, fragments, s)

    idle_gm = gm_loop(args.steps, 10**9, 4, 0.0, poll_s=1.0)
    idle_ref = ref(args.steps, 10**9, 4, 0.0)
    table(
        f"step() with no round due: {args.steps} no-op steps, H far beyond the run",
        idle_gm,
        idle_ref,
        bare_loop(args.steps, 0.0),
    )
    due_gm = gm_loop(args.due_steps, 8, 2, step_s, poll_s=args.poll_ms / 1e3)
    due_ref = ref(args.due_steps, 8, 2, step_s)
    table(
        f"step() with rounds due: {args.due_steps} steps of {args.step_ms:g} ms, H=8, P=2 "
        f"(a round every 4 steps), 128 KiB model, learner+closer over memory://, "
        f"gm polls every {args.poll_ms:g} ms",
        due_gm,
        due_ref,
        bare_loop(args.due_steps, step_s),
    )
    print(f"\n(python {sys.version.split()[0]}, done in {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
