"""Robust merges against one poisoned learner of four: final loss by merge rule and attack.

Run: ``nice -n 10 .venv/bin/python -m bench.bench_robust [--steps 200]
[--rules mean,trimmed_mean,median,clip,screen] [--attacks clean,x100,flip]
[--runs runs/bench-robust]`` (``make bench-robust`` runs the default grid).

Every cell is a real demo run (:mod:`gm_shell.demo`, reused through
:func:`bench.bench_loss.measure`): four learner processes train the character
transformer through a ``file://`` mailbox with ``Session`` (quorum: all four), and
the committed model's held-out loss is scored when they finish. Under an attack,
learner 3 is poisoned-but-finite (:mod:`bench.poison`): it trains like the others
but publishes every delta multiplied by 100 (``x100``) or by −1 (``flip``). Rules:

* ``mean``: the weighted mean (tokens²/steps, ``max_share`` 2), gm's default;
* ``trimmed_mean``: coordinate-wise, one value of four dropped at each end;
* ``median``: coordinate-wise, the weighted mean of the middle two of four;
* ``clip``: the mean, each delta clipped to 2× the round's median delta norm;
* ``screen``: the mean, rejecting deltas above 3× the median norm or with a negative
  cosine to the coordinate-wise median (``outlier`` on the tape).

A run in which a learner fails (a poisoned merge can drive the model to NaN, and
learners then stop with ``DivergedError``) is reported as failed with its reason.
Figures compare cells of one run of this script; the demo spec is otherwise the
default, with ``--steps`` per learner.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from bench.bench_loss import measure
from gm_shell.demo import launch, layout
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.tape import read_rounds

RULES: dict[str, dict[str, Any]] = {
    "mean": {},
    "trimmed_mean": {"merge": "trimmed_mean"},
    "median": {"merge": "median"},
    "clip": {"clip_norm_factor": 2.0},
    "screen": {"outlier_norm_factor": 3.0, "outlier_cosine": 0.0},
}
ATTACKS: dict[str, float | None] = {"clean": None, "x100": 100.0, "flip": -1.0}
POISONED = 3
"""The index of the poisoned learner (of four)."""


def starter(factor: float | None) -> Any:
    """Start the demo's learners, learner :data:`POISONED` through ``bench.poison``."""

    def start(spec: DemoSpec, run: layout.RunDir) -> dict[str, subprocess.Popen[bytes]]:
        procs = {}
        for k in range(spec.learners):
            name = layout.learner_name(k)
            if factor is not None and k == POISONED:
                procs[name] = launch.start_worker(run, name, "bench.poison", str(k), str(factor))
            else:
                procs[name] = launch.start_worker(run, name, "gm_shell.demo.learner_proc", str(k))
        return procs

    return start


@attrs.frozen(kw_only=True)
class Cell:
    loss: float | None
    rounds: int
    outliers: int
    """Rounds that rejected the poisoned learner as ``outlier``."""
    failure: str = ""


def cell(spec: DemoSpec, runs: Path, factor: float | None) -> Cell:
    try:
        got = measure(spec, runs, baseline=False, start=starter(factor))
    except launch.DemoError as error:
        first = str(error).splitlines()[0]
        records, _ = read_rounds(layout.RunDir(runs / spec.name).mailbox_url)
        return Cell(loss=None, rounds=len(records), outliers=0, failure=first)
    records, _ = read_rounds(layout.RunDir(runs / spec.name).mailbox_url)
    poisoned = layout.learner_name(POISONED)
    outliers = sum(
        any(x.learner == poisoned and x.reason == "outlier" for x in r.rejections) for r in records
    )
    return Cell(loss=got.loss, rounds=got.rounds, outliers=outliers)


def shown(c: Cell) -> str:
    if c.loss is None:
        return f"failed after {c.rounds} rounds"
    rejected = f", {c.outliers} rejected" if c.outliers else ""
    return f"{c.loss:.4f} ({c.rounds} rounds{rejected})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-robust"))
    args = parser.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    attacks = [a for a in args.attacks.split(",") if a]
    args.runs.mkdir(parents=True, exist_ok=True)
    base = DemoSpec(learners=4)
    base = attrs.evolve(base, inner=attrs.evolve(base.inner, steps=args.steps))
    print(f"# bench_robust: 4 learners, {args.steps} steps each, learner {POISONED} poisoned\n")
    print("| rule | " + " | ".join(attacks) + " |")
    print("|---|" + "---|" * len(attacks))
    failures = []
    for rule in rules:
        cells = []
        for attack in attacks:
            spec = attrs.evolve(
                base, name=f"robust-{rule}-{attack}", gm=attrs.evolve(base.gm, **RULES[rule])
            )
            got = cell(spec, args.runs, ATTACKS[attack])
            if got.failure:
                failures.append(f"{rule}/{attack}: {got.failure}")
            cells.append(shown(got))
        print(f"| {rule} | " + " | ".join(cells) + " |", flush=True)
    for line in failures:
        print(f"\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
