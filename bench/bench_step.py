"""What ``Session.step()`` adds to a training step: with no round due, and with rounds due.

Run: ``.venv/bin/python -m bench.bench_step [--steps 20000] [--due-steps 1000] [--repeat 3]``

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
  closer over ``memory://``, polling every ``--poll-ms``: on due steps ``step()`` copies
  the fragment the loop planned for that step and signals the loop, and on the steps
  after a commit it folds the commit in; the closer merges and commits meanwhile. The
  figures are given for all steps and for the **due steps** alone (those at which a
  fragment was captured: gm's by its schedule, the reference's where its learner
  queued a snapshot). With ``in_flight`` 2, a gm due step also waits for a commit that
  fell behind (the core stalls training there; the reference instead postpones the
  round): on a loaded machine, where the closer's round takes longer than two rounds
  of steps, those waits are in gm's tail, so the due steps at which gm waited for
  nothing (no stall, no report to the loop: ``Pacer.waits``) and those at which it
  waited are shown apart too (for the reference, the first row is all its due steps).

The two sides run ``--repeat`` times each, alternately (gm, reference, gm, …), and the
samples of each side are pooled, so a change of load during the run falls on both; the
load average is printed at the start and the end.

The reference package (``gradientmail`` 0.0.2) runs the same loops inside its
``Session.run`` when ``bench/.venv-ref`` exists (``bash bench/setup_reference.sh``);
its figures print beside gm's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
IN_FLIGHT = 2
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


def timed_train(
    step_s: float, last: Callable[[int], None] | None = None
) -> tuple[Callable[[int], None], list[int], list[int]]:
    """A training function that records when it starts and ends, and sleeps ``step_s``.

    ``last(batch)`` runs at the end of each call, before its end is recorded: the benchmark's
    own bookkeeping about the ``step()`` that follows, kept out of the gap that is measured.
    """
    enter: list[int] = []
    leave: list[int] = []

    def train(batch: int) -> None:
        enter.append(time.perf_counter_ns())
        if step_s:
            time.sleep(step_s)
        if last is not None:
            last(batch)
        leave.append(time.perf_counter_ns())

    return train, enter, leave


def gaps(enter: list[int], leave: list[int]) -> list[int]:
    """Gap ``i`` holds ``step()`` number ``i + 1`` (the step count it brings the session to)."""
    return [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]


Sample = tuple[list[int], list[str]]
"""Gaps in nanoseconds, and what each step was: ``other``, ``due``, or ``waited`` (a gm due
step that waited for the loop: the core stalled training until a commit was folded in, or
had not planned the step)."""


def _signed_solo(signed: bool) -> dict[str, Any]:
    """The Session arguments of the lone node ``solo`` in a run with per-node keys."""
    if not signed:
        return {"node_key": None, "roster": None}
    from bench.gm_runs import bench_roster, node_key

    return {"node_key": node_key("solo"), "roster": bench_roster({"solo": ("learner", "closer")})}


def gm_loop(
    steps: int,
    sync_every: int,
    fragments: int,
    step_s: float,
    poll_s: float,
    *,
    mailbox: str = "memory://",
    run_key: bytes | None = None,
    signed: bool = False,
) -> tuple[Sample, int]:
    """gm's gaps and what each step was, and the rounds committed.

    ``mailbox`` is the run's URL and ``run_key`` its key (None: an open run), so
    bench_auth.py can run the same loop authenticated and open; ``signed``: with per-node
    keys too (the node signs everything it writes and checks every signature it reads).

    A lone learner on a fresh run never skips ahead, so round ``r`` is due at
    ``step_of(r)``. The core stalls that step while ``r > aligned + in_flight``: the step
    then reports to the loop and waits until the commit is folded in, as it reports where
    the loop has not planned the step (``Pacer.waits`` counts both, the round trips and the
    sleeps; read inside ``train``, outside the measured gaps).
    """
    import torch

    from gm_core import schedule
    from gm_shell import DiLoCo, Session, SessionOptions

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64, bias=False) for _ in range(8)))
    session = Session(
        model,
        algorithm=DiLoCo(sync_every=sync_every, fragments=fragments, in_flight=IN_FLIGHT),
        mailbox=mailbox,
        node="solo",
        options=SessionOptions(poll_s=poll_s, compute="numpy"),
        run_key=run_key,
        **_signed_solo(signed),
    )
    due = {schedule.step_of(r, sync_every, fragments) for r in range(steps)}
    seen: list[tuple[int, tuple[int, ...]]] = []

    def look(_batch: int) -> None:
        """The training thread's waits for the loop so far (round trips and sleeps; a lock
        found held is the step's own cost, not counted) and the anchors the model holds
        (a fold-in replaces its fragment's), before the coming ``step()``."""
        pacer, replica = session._pacer, session._replica
        assert pacer is not None
        assert replica is not None
        waited = pacer.waits
        seen.append((waited.round_trips + waited.sleeps, tuple(map(id, replica._anchors))))

    train, enter, leave = timed_train(step_s, look)
    with session:
        for batch in range(steps):
            train(batch)
            session.step(samples=1)
        rounds = session.round + 1
    kinds = [  # gap i holds the step() of iteration i, which brings the count to i + 1
        kind(i + 1 in due, before, after) for i, (before, after) in enumerate(pairwise(seen))
    ]
    return (gaps(enter, leave), kinds), rounds


def kind(due: bool, before: tuple[int, Any], after: tuple[int, Any]) -> str:
    """What a gm ``step()`` was, from the waits and anchors seen before and after it."""
    if not due:
        return "other"
    if after[0] > before[0]:
        return "waited"
    return "folded" if after[1] != before[1] else "due"


def bare_loop(steps: int, step_s: float) -> list[int]:
    train, enter, leave = timed_train(step_s)
    for batch in range(steps):
        train(batch)
    return gaps(enter, leave)


REFERENCE_CODE = """
import json, sys, time
sys.path.insert(0, {refdir!r})
from gradientmail import DiLoCo, MemoryMailbox, Session
from gradientmail.learner import Learner
from gradientmail.adapters import MemoryAdapter
from numpy_adapter import ArrayAdapter, NumpyBackend, tensors_of
from refkit import model_arrays
enter, leave, due = [], [], set()
queue_snapshot = Learner._publish
def publish(self, run, state, round, *, final):
    due.add(len(leave))  # the step count this step() brings the learner to
    return queue_snapshot(self, run, state, round, final=final)
Learner._publish = publish
class Counted(MemoryAdapter):
    applied = 0
    def apply(self, tensors):
        self.applied += 1
        return super().apply(tensors)
arrays = model_arrays(8, 4096)
model = ArrayAdapter(arrays) if {copies!r} else Counted(tensors_of(arrays))
applied = []
def step(_batch):
    enter.append(time.perf_counter_ns())
    if {step_s!r}:
        time.sleep({step_s!r})
    applied.append(model.applied)  # commits folded in before the coming step()
    leave.append(time.perf_counter_ns())
    return 1
session = Session(
    model,
    algorithm=DiLoCo(sync_every={sync_every!r}, fragments={fragments!r}),
    mailbox=MemoryMailbox(), node_id="solo", backend=NumpyBackend(), callbacks=(),
    poll_interval={poll_s!r},
)
session.join()
session.run(step, range({steps!r}))
gaps = [enter[i + 1] - leave[i] for i in range(len(enter) - 1)]
kinds = [
    "other" if i + 1 not in due else "folded" if applied[i + 1] > applied[i] else "due"
    for i in range(len(gaps))
]
print(json.dumps([gaps, kinds]))
"""


def reference_loop(
    steps: int,
    sync_every: int,
    fragments: int,
    step_s: float,
    poll_s: float,
    *,
    copies: bool = True,
) -> Sample | str:
    """The reference's Session.run over the same loop, or why it could not run.

    It polls every ``poll_s`` as gm does (its default, 1 s, would let it commit a round
    only every few seconds, and skip the captures in between). Its model is a
    ``numpy_adapter.ArrayAdapter``, whose snapshots copy the fragment's bytes as its torch
    adapter does, so both sides copy the same 64 KiB at a due step; with ``copies`` False
    its own ``MemoryAdapter`` instead, whose model is immutable bytes: its snapshot hands
    out references and copies nothing (less work than a real model's due step). Its due
    steps are those at which its learner queued a snapshot (``Learner._publish`` is
    wrapped to note the step; the wrapper adds a call to those steps only).
    """
    if not REFERENCE_PYTHON.exists():
        return "bench/.venv-ref is missing (bash bench/setup_reference.sh)"
    code = REFERENCE_CODE.format(
        refdir=str(HERE / "reference"),
        steps=steps,
        sync_every=sync_every,
        fragments=fragments,
        step_s=step_s,
        poll_s=poll_s,
        copies=copies,
    )
    try:
        done = subprocess.run(
            [str(REFERENCE_PYTHON), "-c", code],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        measured, kinds = json.loads(done.stdout.strip().splitlines()[-1])
        return list(measured), list(kinds)
    except (subprocess.SubprocessError, ValueError, IndexError) as error:
        return f"reference failed: {type(error).__name__}: {str(error)[:300]}"


def pool(samples: list[Sample]) -> Sample:
    """The samples of one side's repeats together."""
    gathered: list[int] = []
    kinds: list[str] = []
    for measured, kind in samples:
        gathered += measured
        kinds += kind
    return gathered, kinds


def pool_reference(samples: list[Sample | str]) -> Sample | str:
    """The reference's samples together, or the first reason a run of it failed."""
    reasons = [s for s in samples if isinstance(s, str)]
    return reasons[0] if reasons else pool([s for s in samples if not isinstance(s, str)])


def table(title: str, gm: Sample, ref: Sample | str, bare: list[int], note: str = "") -> None:
    print(f"\n{title}")
    if isinstance(ref, str):
        print(f"  reference: {ref}")
    print(f"  {'us per step':<22}{'gm':>10}{'reference':>12}{'ref/gm':>9}{'bare loop':>12}")
    rows = [
        ("all steps", {"other", "due", "folded", "waited"}),
        ("due steps", {"due", "folded", "waited"}),
        ("due steps that only copied (no commit folded in, no wait)", {"due"}),
        ("due steps that folded a commit in first, without a wait", {"folded"}),
        ("due steps at which gm waited for the loop (in_flight stall or no plan)", {"waited"}),
    ]
    if set(gm[1]) == {"other"}:
        rows = rows[:1]
    bare_figures = summary(bare)
    nothing = dict.fromkeys(("median_us", "p90_us", "p99_us", "mean_us"), float("nan"))

    def figures(sample: Sample | str, kinds: set[str]) -> tuple[dict[str, float], int | str]:
        if isinstance(sample, str):
            return nothing, "-"
        chosen = [g for g, k in zip(*sample, strict=True) if k in kinds]
        return (summary(chosen) if chosen else nothing), len(chosen)

    for label, kinds in rows:
        ours, count = figures(gm, kinds)
        theirs, ref_count = figures(ref, kinds)
        print(f"  {label} (gm {count}, reference {ref_count})")
        for key in ("median_us", "p90_us", "p99_us", "mean_us"):
            value = theirs[key]
            ratio = value / ours[key] if ours[key] > 0 else float("nan")
            name = "  " + key.removesuffix("_us")
            line = f"  {name:<22}{ours[key]:>10.2f}{value:>12.2f}{ratio:>8.1f}x"
            print(line + (f"{bare_figures[key]:>12.2f}" if label == "all steps" else ""))
    if note:
        print(f"  {note}")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cpus"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000, help="no-round-due steps")
    parser.add_argument("--due-steps", type=int, default=1000, help="steps with rounds due")
    parser.add_argument("--step-ms", type=float, default=10.0, help="sleep per step, rounds due")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="poll, rounds due")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, alternately")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument(
        "--reference-copies-nothing",
        action="store_true",
        help="the reference's MemoryAdapter (immutable bytes: its due step copies nothing) "
        "instead of an adapter over arrays whose snapshot copies, as its torch adapter does",
    )
    args = parser.parse_args()
    step_s = args.step_ms / 1e3
    started = time.monotonic()
    print(f"start: {load()}")

    def ref(steps: int, sync_every: int, fragments: int, s: float, poll_s: float) -> Sample | str:
        if args.no_reference:
            return "skipped (--no-reference)"
        return reference_loop(
            steps, sync_every, fragments, s, poll_s, copies=not args.reference_copies_nothing
        )

    idle_gm: list[Sample] = []
    idle_ref: list[Sample | str] = []
    due_gm: list[Sample] = []
    due_ref: list[Sample | str] = []
    rounds = 0
    for _ in range(args.repeat):
        idle_gm.append(gm_loop(args.steps, 10**9, 4, 0.0, poll_s=1.0)[0])
        idle_ref.append(ref(args.steps, 10**9, 4, 0.0, 1.0))
    for _ in range(args.repeat):
        sample, committed = gm_loop(args.due_steps, 8, 2, step_s, poll_s=args.poll_ms / 1e3)
        due_gm.append(sample)
        rounds += committed
        due_ref.append(ref(args.due_steps, 8, 2, step_s, args.poll_ms / 1e3))
    table(
        f"step() with no round due: {args.steps} no-op steps x {args.repeat}, H far beyond the run",
        pool(idle_gm),
        pool_reference(idle_ref),
        bare_loop(args.steps, 0.0),
    )
    table(
        f"step() with rounds due: {args.due_steps} steps of {args.step_ms:g} ms x "
        f"{args.repeat}, H=8, P=2 (a round every 4 steps), 128 KiB model, learner+closer "
        f"over memory://, both poll every {args.poll_ms:g} ms; the reference's due step "
        + ("copies nothing" if args.reference_copies_nothing else "copies its fragment too"),
        pool(due_gm),
        pool_reference(due_ref),
        bare_loop(args.due_steps, step_s),
        note=f"gm rounds committed during its runs: {rounds}",
    )
    print(f"\nend: {load()}")
    print(f"(python {sys.version.split()[0]}, done in {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
