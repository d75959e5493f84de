"""``gm demo``: start the learners and the baseline, watch them, and report.

Theory of operation
-------------------
The launcher owns a run folder (:mod:`gm_shell.demo.layout`): it writes the
spec, starts one process per learner (:mod:`gm_shell.demo.learner_proc`, all
through the run's ``file://`` mailbox) and one for the data-parallel baseline
(:mod:`gm_shell.demo.baseline`), all at once so the baseline trains "in the same
run" on the same cores. While they train it redraws their progress lines and
scores the newest committed model now and then (:mod:`gm_shell.demo.committed`);
a process that fails stops the demo (the others are terminated) with the tail
of its log, and SIGTERM or SIGINT to the launcher terminates them all (the
learners then leave the run: none trains on alone, holding its lease). When
all have exited it reads the tape and scores the final
committed model, writes ``summary.json`` and prints the table, and only then
draws the plot (``gm demo`` checks for torch and matplotlib before it starts).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import attrs

from gm_shell import leaving
from gm_shell.accounting import Stats
from gm_shell.demo import layout, progress
from gm_shell.demo import spec as spec_module
from gm_shell.demo.committed import COMMITTED, CommittedEvaluator
from gm_shell.demo.display import LiveDisplay, render
from gm_shell.demo.plot import plot_losses
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.demo.summary import LearnerTotals, Summary, save, table
from gm_shell.demo.tape import figures, read_rounds

POLL_S = 0.5
EVAL_PERIOD_S = 5.0
"""How often the launcher scores the newest committed model while the run trains."""
LOG_TAIL_LINES = 30


class DemoError(RuntimeError):
    """A worker process failed; the message names it and quotes its log."""


def prepare(spec: DemoSpec, runs_root: Path) -> layout.RunDir:
    """A fresh run folder for ``spec.name`` holding only the spec.

    A previous demo run of the same name is removed (its mailbox would hold
    another run); a folder that is not a demo run is left alone, with an error.
    """
    run = layout.RunDir(runs_root / spec.name)
    if run.root.exists():
        if not run.spec_path.exists():
            raise DemoError(f"{run.root} exists and is not a demo run; choose another --name")
        shutil.rmtree(run.root)
    run.root.mkdir(parents=True)
    spec_module.save(spec, run.spec_path)
    return run


def start_worker(
    run: layout.RunDir, worker: str, module: str, *args: str
) -> subprocess.Popen[bytes]:
    """``python -m module RUN_DIR *args`` as ``worker``, its output into the worker's log."""
    log = run.log(worker)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", module, str(run.root), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )


def start_workers(
    spec: DemoSpec, run: layout.RunDir, *, baseline: bool = True
) -> dict[str, subprocess.Popen[bytes]]:
    """One process per learner, and the baseline's unless a caller has it already."""
    procs = {
        layout.learner_name(k): start_worker(
            run, layout.learner_name(k), "gm_shell.demo.learner_proc", str(k)
        )
        for k in range(spec.learners)
    }
    if baseline:
        procs[layout.BASELINE] = start_worker(run, layout.BASELINE, "gm_shell.demo.baseline")
    return procs


def views(run: layout.RunDir, workers: list[str]) -> dict[str, progress.WorkerView]:
    return {name: progress.view(progress.read_lines(run.progress(name))) for name in workers}


def _log_tail(run: layout.RunDir, worker: str) -> str:
    lines = run.log(worker).read_text(errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


STOP_GRACE_S = 30.0
"""How long stopped workers get to exit by themselves before they are killed: a learner
leaves the run (deletes its lease) at once on SIGTERM, but then the interpreter tears
torch down, seconds of work on a loaded machine."""


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Terminate the workers still running (only the processes this launcher started)."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs.values():
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _header(spec: DemoSpec, run: layout.RunDir, elapsed_s: float) -> str:
    committed = progress.view(progress.read_lines(run.progress(COMMITTED))).evals
    newest = f" · committed model {committed[-1].loss:.3f}" if committed else ""
    return f"gm demo · {spec.learners} learners · {run.root} · {elapsed_s:.0f} s{newest}"


def watch(
    spec: DemoSpec,
    run: layout.RunDir,
    procs: dict[str, subprocess.Popen[bytes]],
    out: TextIO,
    tick: Callable[[], None] = lambda: None,
) -> float:
    """Redraw progress (calling ``tick`` each time) until every worker exits; the wall time.

    A worker that fails raises DemoError; the others are then terminated, and so are
    all of them when this process gets SIGTERM (``SystemExit(143)`` then: see
    :func:`gm_shell.leaving.sigterm_raises`) or SIGINT, so none trains on alone.
    """
    display = LiveDisplay(out)
    start = time.monotonic()
    with leaving.sigterm_raises():
        try:
            while True:
                tick()
                elapsed = time.monotonic() - start
                frame = render(_header(spec, run, elapsed), views(run, list(procs)), spec.steps)
                failed = [n for n, p in procs.items() if p.returncode not in (None, 0)]
                if failed:
                    raise DemoError(
                        f"{failed[0]} exited with status {procs[failed[0]].returncode}; "
                        f"the end of {run.log(failed[0])}:\n{_log_tail(run, failed[0])}"
                    )
                if all(p.poll() == 0 for p in procs.values()):
                    display.draw(frame, final=True)
                    return elapsed
                display.draw(frame)
                time.sleep(POLL_S)
        finally:
            _stop(procs)


def learner_totals(run: layout.RunDir, learners: int) -> LearnerTotals:
    """The learners' own totals, summed: tokens, time, and mailbox requests."""
    total = LearnerTotals()
    for k in range(learners):
        finished = progress.view(progress.read_lines(run.progress(layout.learner_name(k)))).finished
        if finished is None:
            raise DemoError(f"{layout.learner_name(k)} wrote no totals: did it finish?")
        total = LearnerTotals(
            tokens=total.tokens + finished.tokens,
            compute_s=total.compute_s + finished.compute_s,
            wall_s=total.wall_s + finished.wall_s,
            requests=total.requests + Stats(**finished.requests),
        )
    return total


def summarize(
    spec: DemoSpec, run: layout.RunDir, wall_s: float, evaluator: CommittedEvaluator
) -> Summary:
    """Read the tape, evaluate the final committed model, save and return the summary."""
    stream = TokenStream(spec.data)
    gm_loss = evaluator.final()
    baseline = progress.view(progress.read_lines(run.progress(layout.BASELINE)))
    records, _ = read_rounds(run.mailbox_url)
    unigram = stream.unigram_nats()
    summary = Summary(
        spec=spec,
        wall_s=wall_s,
        tape=figures(records, spec.gm.fragments),
        learners=learner_totals(run, spec.learners),
        gm_loss=gm_loss,
        baseline_loss=baseline.evals[-1].loss,
        unigram_loss=unigram,
    )
    save(summary, run.summary_path)
    return summary


def plot(spec: DemoSpec, run: layout.RunDir, summary: Summary) -> None:
    """Draw the loss curves (after the results are saved and printed: a plot is the extra)."""
    committed = progress.view(progress.read_lines(run.progress(COMMITTED)))
    baseline = progress.view(progress.read_lines(run.progress(layout.BASELINE)))
    plot_losses(
        committed.evals,
        baseline.evals,
        summary.unigram_loss,
        run.plot_path,
        f"{spec.learners} gm learners (H={spec.gm.sync_every}, P={spec.gm.fragments})"
        " vs data-parallel",
    )


def run_demo(spec: DemoSpec, runs_root: Path, out: TextIO = sys.stdout) -> Summary:
    """The whole demo: prepare, train, watch, summarize; prints the table and file paths."""
    run = prepare(spec, runs_root)
    out.write(watch_hint(run))
    evaluator = CommittedEvaluator(spec, run, TokenStream(spec.data), EVAL_PERIOD_S)
    try:
        wall_s = watch(spec, run, start_workers(spec, run), out, evaluator.poll)
        summary = summarize(spec, run, wall_s, evaluator)
    finally:
        evaluator.close()
    out.write(
        f"\n{table(summary)}\n\n  summary: {run.summary_path}\n"
        f"  mailbox: {run.mailbox_url}\n  the run's tape: gm status {run.mailbox_url}\n"
    )
    out.flush()
    plot(spec, run, summary)
    out.write(f"  plot: {run.plot_path}\n")
    return summary


def watch_hint(run: layout.RunDir) -> str:
    """Where the run lives and the command that shows its tape (from another terminal too)."""
    return f"mailbox: {run.mailbox_url}\nwatch it: gm status {run.mailbox_url}\n"


def spec_from_args(args: argparse.Namespace) -> DemoSpec:
    """The default (or tiny) spec with the command line's overrides applied."""
    name = args.name or ("tiny" if args.tiny else "demo")
    base = spec_module.tiny(name) if args.tiny else DemoSpec(name=name)
    knobs = {
        "sync_every": args.sync_every,
        "fragments": args.fragments,
        "outer_lr": args.outer_lr,
        "outer_momentum": args.outer_momentum,
        "delta_format": args.delta_format,
        "alignment": args.alignment,
        "quorum": args.quorum,
        "in_flight": args.in_flight,
        "overlap_steps": args.overlap_steps,
    }
    gm = attrs.evolve(base.gm, **{k: v for k, v in knobs.items() if v is not None})
    inner = base.inner if args.steps is None else attrs.evolve(base.inner, steps=args.steps)
    learners = base.learners if args.learners is None else args.learners
    return attrs.evolve(base, gm=gm, inner=inner, learners=learners)


def main(args: argparse.Namespace) -> int:
    """``gm demo``: 0 when the run completed (whatever the loss ratio), 1 when a worker failed."""
    try:
        run_demo(spec_from_args(args), Path(args.runs))
    except DemoError as error:
        print(f"gm demo: {error}", file=sys.stderr)
        return 1
    return 0
