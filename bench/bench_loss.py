"""Loss against data-parallel training as a curve, and quantized deltas vs fp32, from gm runs.

Run: ``nice -n 15 .venv/bin/python -m bench.bench_loss [--steps 800,2400] [--learners 2,4]
[--sync-every 10,30,100] [--formats BF16,F8_E4M3,F4_E2M1] [--runs runs/bench-loss]``

Every row is a real demo run (:mod:`gm_shell.demo`): ``M`` learner processes
train the character transformer through a ``file://`` mailbox with ``Session``,
and the data-parallel baseline of ``M`` simulated workers trains on exactly the
same tokens (same seed, schedule, steps). Each figure is a ratio inside one run
of this script: the committed gm model's held-out loss over the baseline's, and
a quantized run's loss and delta bytes over the fp32 run's.

* loss vs data-parallel, as a curve: ``M`` ∈ --learners × ``H`` ∈ --sync-every at
  every training length in --steps (each length is its own run with its own
  learning-rate schedule, so the short run's end is not the long run's middle);
  ``P``, outer lr/momentum, alignment and inner lr are the demo's. One baseline
  per ``M`` and length, trained next to the first of its runs. Longest lengths run
  first (the figure the README quotes); a table of gm/DP by length closes the
  output, and ``<runs>/loss-m<M>-h<H>.png`` plots held-out loss against tokens
  for every length (gm's committed model and the baseline). Anchors (Streaming
  DiLoCo, 35M parameters): +0.6 % to +1.4 % for 2 learners, +2.6 % to +3.7 % for 4.
* quantized deltas (skipped with ``--formats ''``): the demo's ``M`` and ``H`` at
  the shortest length, deltas sent as each format (commits stay fp32); loss change
  vs the fp32 run and the measured size of a delta payload (read from the newest
  snapshots in the bucket). Anchor: 4-bit deltas cost ~0.1 % loss.

Runs go by (M, H), every length of one before the next, so a grid stopped early
leaves whole curves. Cost: a 2,400-step run of 2 learners and its baseline took
about an hour on the 2 shared cores here under load (an 800-step one ~2 minutes
on idle cores); the default grid is many hours, so state the subset you ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from gm_shell.demo import launch, layout, progress
from gm_shell.demo.committed import COMMITTED, CommittedEvaluator
from gm_shell.demo.plot import Curve, plot_curves
from gm_shell.demo.progress import Evaluated
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.demo.tape import delta_bytes, read_rounds


@attrs.frozen(kw_only=True)
class Measured:
    loss: float
    rounds: int
    delta_bytes: float | None
    curve: tuple[Evaluated, ...]
    """The committed model's held-out loss while the run trained, by tokens."""
    baseline: tuple[Evaluated, ...] = ()
    """The baseline's evaluations, when this run trained it next to itself."""


def _evals(run: layout.RunDir, worker: str) -> tuple[Evaluated, ...]:
    return tuple(progress.view(progress.read_lines(run.progress(worker))).evals)


Starter = Callable[[DemoSpec, layout.RunDir], dict[str, "subprocess.Popen[bytes]"]]
"""Starts a run's worker processes (the demo's learners, or a bench's own mix of them)."""


def measure(
    spec: DemoSpec, runs: Path, *, baseline: bool, start: Starter | None = None
) -> Measured:
    """One gm run (and optionally its baseline) to the end; the committed model's loss.

    ``start`` starts the workers (default: the demo's learners, and the baseline if asked).
    """
    run = launch.prepare(spec, runs)
    evaluator = CommittedEvaluator(spec, run, TokenStream(spec.data), launch.EVAL_PERIOD_S)
    try:
        if start is None:
            procs = launch.start_workers(spec, run, baseline=baseline)
        else:
            procs = start(spec, run)
        launch.watch(spec, run, procs, sys.stderr, evaluator.poll)
        loss = evaluator.final()
    finally:
        evaluator.close()
    records, _ = read_rounds(run.mailbox_url)
    return Measured(
        loss=loss,
        rounds=len(records),
        delta_bytes=delta_bytes(run.mailbox_url, records, spec.gm.fragments),
        curve=_evals(run, COMMITTED),
        baseline=_evals(run, layout.BASELINE) if baseline else (),
    )


def with_sync_every(spec: DemoSpec, h: int) -> DemoSpec:
    return attrs.evolve(
        spec,
        name=f"loss-m{spec.learners}-h{h}-s{spec.steps}",
        gm=attrs.evolve(spec.gm, sync_every=h),
    )


def with_steps(spec: DemoSpec, steps: int) -> DemoSpec:
    return attrs.evolve(spec, inner=attrs.evolve(spec.inner, steps=steps))


def with_deltas(spec: DemoSpec, fmt: str) -> DemoSpec:
    return attrs.evolve(spec, name=f"fmt-{fmt}", gm=attrs.evolve(spec.gm, delta_format=fmt))


@attrs.frozen(kw_only=True)
class Point:
    """One configuration at one training length: gm's run and the baseline of its ``M``."""

    learners: int
    sync_every: int
    steps: int
    gm: Measured
    baseline: tuple[Evaluated, ...]

    @property
    def ratio(self) -> float:
        return self.gm.loss / self.baseline[-1].loss


def plot_config(points: Sequence[Point], unigram: float, path: Path) -> None:
    """Loss vs tokens of one (M, H) at every length measured: gm solid, baseline dashed."""
    curves: list[Curve] = []
    for k, pt in enumerate(sorted(points, key=lambda q: q.steps)):
        color = f"C{k}"
        curves.append(
            Curve(
                label=f"data-parallel, {pt.steps:,} steps",
                points=pt.baseline,
                style="--",
                color=color,
            )
        )
        curves.append(
            Curve(
                label=f"gm committed, {pt.steps:,} steps",
                points=pt.gm.curve,
                style=".-",
                color=color,
            )
        )
    first = points[0]
    plot_curves(
        curves,
        unigram,
        path,
        f"{first.learners} gm learners (H={first.sync_every}) vs data-parallel",
    )


def loss_rows(
    base: DemoSpec,
    lengths: Sequence[int],
    learners: Sequence[int],
    hs: Sequence[int],
    runs: Path,
) -> list[Point]:
    """Every (M, H) at every length, longest first; each row printed (and its plot redrawn)
    as soon as it is measured, so an interrupted grid still leaves whole curves behind."""
    unigram = TokenStream(base.data).unigram_nats()
    points: list[Point] = []
    baselines: dict[tuple[int, int], tuple[Evaluated, ...]] = {}
    print("\n## gm vs data-parallel (committed model's held-out loss, nats/char)\n")
    print("| steps | M | H | P | rounds | gm loss | DP loss | gm / DP |")
    print("|---|---|---|---|---|---|---|---|")
    for m in learners:
        for h in hs:
            for steps in sorted(lengths, reverse=True):
                spec = with_sync_every(with_steps(attrs.evolve(base, learners=m), steps), h)
                dp = baselines.get((m, steps), ())
                got = measure(spec, runs, baseline=not dp)
                dp = baselines.setdefault((m, steps), dp or got.baseline)
                pt = Point(learners=m, sync_every=h, steps=steps, gm=got, baseline=dp)
                points.append(pt)
                print(
                    f"| {steps:,} | {m} | {h} | {spec.gm.fragments} | {got.rounds} "
                    f"| {got.loss:.4f} | {dp[-1].loss:.4f} | {pt.ratio:.4f} |",
                    flush=True,
                )
            same = [q for q in points if (q.learners, q.sync_every) == (m, h)]
            plot_config(same, unigram, runs / f"loss-m{m}-h{h}.png")
    return points


def loss_at(curve: Sequence[Evaluated], tokens: int) -> float | None:
    """A curve's loss at ``tokens``, linear between its two nearest evaluations (None: outside)."""
    pts = sorted((e.tokens, e.loss) for e in curve)
    for (t0, l0), (t1, l1) in itertools.pairwise(pts):
        if t0 <= tokens <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (tokens - t0) / (t1 - t0)
    return None


def curve_table(points: Sequence[Point], base: DemoSpec) -> None:
    """gm/DP along each run: at its end (both final evaluations), and at the shorter lengths
    and thirds of the run on its own curves (interpolated: same schedule, earlier point)."""
    longest = max(p.steps for p in points)
    marks = sorted({p.steps for p in points} | {longest // 3, 2 * longest // 3})
    print("\n## gm / DP along each run (steps per learner; the last cell is the run's end)\n")
    print("| M | H | run | " + " | ".join(f"at {n:,}" for n in marks) + " |")
    print("|---|---|---|" + "---|" * len(marks))
    for p in sorted(points, key=lambda q: (q.learners, q.sync_every, q.steps)):
        spec = attrs.evolve(base, learners=p.learners)
        cells = []
        for n in marks:
            gm = p.gm.loss if n == p.steps else loss_at(p.gm.curve, spec.tokens_at(n))
            dp = p.baseline[-1].loss if n == p.steps else loss_at(p.baseline, spec.tokens_at(n))
            cells.append("—" if n > p.steps or gm is None or dp is None else f"{gm / dp:.3f}")
        row = f"| {p.learners} | {p.sync_every} | {p.steps:,} | " + " | ".join(cells) + " |"
        print(row, flush=True)


def _kib(size: float | None) -> str:
    return "n/a" if size is None else f"{size / 1024:.1f} KiB"


def format_rows(base: DemoSpec, formats: Sequence[str], runs: Path) -> None:
    print(f"\n## Quantized deltas vs fp32 (M={base.learners}, H={base.gm.sync_every})\n")
    print("| deltas | gm loss | loss change | delta payload | bytes vs fp32 |")
    print("|---|---|---|---|---|")
    ref = measure(with_deltas(base, "F32"), runs, baseline=False)
    print(f"| F32 | {ref.loss:.4f} | — | {_kib(ref.delta_bytes)} | 1 |", flush=True)
    for fmt in formats:
        got = measure(with_deltas(base, fmt), runs, baseline=False)
        ratio = (
            "n/a"
            if got.delta_bytes is None or ref.delta_bytes is None
            else f"{got.delta_bytes / ref.delta_bytes:.3f}"
        )
        change = (got.loss / ref.loss - 1) * 100
        print(
            f"| {fmt} | {got.loss:.4f} | {change:+.2f} % | {_kib(got.delta_bytes)} | {ratio} |",
            flush=True,
        )


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_ints, default=[DemoSpec().steps, 3 * DemoSpec().steps])
    parser.add_argument("--learners", type=_ints, default=[2, 4])
    parser.add_argument("--sync-every", type=_ints, default=[10, 30, 100])
    parser.add_argument("--formats", default="BF16,F8_E4M3,F4_E2M1")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-loss"))
    args = parser.parse_args(argv)
    if importlib.util.find_spec("gm_shell.session") is None:
        print("bench_loss: gm_shell.session does not exist yet (issue #6): nothing to measure")
        return 2
    args.runs.mkdir(parents=True, exist_ok=True)
    lengths = ", ".join(f"{n:,}" for n in args.steps)
    print(f"# bench_loss: {lengths} steps per learner, demo spec otherwise")
    if args.learners and args.sync_every:
        points = loss_rows(DemoSpec(), args.steps, args.learners, args.sync_every, args.runs)
        curve_table(points, DemoSpec())
    formats = [f for f in args.formats.split(",") if f]
    if formats:
        format_rows(with_steps(DemoSpec(), min(args.steps)), formats, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
