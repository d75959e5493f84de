"""Loss against data-parallel training, and quantized deltas against fp32, from real gm runs.

Run: ``.venv/bin/python -m bench.bench_loss [--steps 800] [--learners 2,4]
[--sync-every 10,30,100] [--formats BF16,F8_E4M3,F4_E2M1] [--runs runs/bench-loss]``

Every row is a real demo run (:mod:`gm_shell.demo`): ``M`` learner processes
train the character transformer through a ``file://`` mailbox with ``Session``,
and the data-parallel baseline of ``M`` simulated workers trains on exactly the
same tokens (same seed, schedule, steps). Each figure is a ratio inside one run
of this script: the committed gm model's held-out loss over the baseline's, and
a quantized run's loss and delta bytes over the fp32 run's.

* loss vs data-parallel: ``M`` ∈ --learners × ``H`` ∈ --sync-every; ``P``,
  outer lr/momentum, alignment and inner lr are the demo's. One baseline per
  ``M``, trained next to the first of its runs. Anchors (Streaming DiLoCo,
  35M parameters): +0.6 % to +1.4 % for 2 learners, +2.6 % to +3.7 % for 4.
* quantized deltas: the demo's ``M`` and ``H``, deltas sent as each format
  (commits stay fp32); loss change vs the fp32 run and the measured size of a
  delta payload (read from the newest snapshots in the bucket). Anchor: 4-bit
  deltas cost ~0.1 % loss.

Runs share 2 cores here; a full table is ~15 demo-sized runs (tens of minutes).
``--steps`` shortens every run (the ratios then mean less: the gap closes as
training proceeds).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from gm_shell.demo import launch, layout, progress
from gm_shell.demo.committed import CommittedEvaluator
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.demo.tape import delta_bytes, read_rounds


@attrs.frozen(kw_only=True)
class Measured:
    loss: float
    rounds: int
    delta_bytes: float | None
    baseline_loss: float | None
    """Set when this run trained the baseline next to it."""


def measure(spec: DemoSpec, runs: Path, *, baseline: bool) -> Measured:
    """One gm run (and optionally its baseline) to the end; the committed model's loss."""
    run = launch.prepare(spec, runs)
    evaluator = CommittedEvaluator(spec, run, TokenStream(spec.data), launch.EVAL_PERIOD_S)
    try:
        procs = launch.start_workers(spec, run, baseline=baseline)
        launch.watch(spec, run, procs, sys.stderr, evaluator.poll)
        loss = evaluator.final()
    finally:
        evaluator.close()
    records, _ = read_rounds(run.mailbox_url)
    base = None
    if baseline:
        base = progress.view(progress.read_lines(run.progress(layout.BASELINE))).evals[-1].loss
    return Measured(
        loss=loss,
        rounds=len(records),
        delta_bytes=delta_bytes(run.mailbox_url, records, spec.gm.fragments),
        baseline_loss=base,
    )


def with_sync_every(spec: DemoSpec, h: int) -> DemoSpec:
    return attrs.evolve(
        spec, name=f"loss-m{spec.learners}-h{h}", gm=attrs.evolve(spec.gm, sync_every=h)
    )


def with_deltas(spec: DemoSpec, fmt: str) -> DemoSpec:
    return attrs.evolve(spec, name=f"fmt-{fmt}", gm=attrs.evolve(spec.gm, delta_format=fmt))


def loss_rows(base: DemoSpec, learners: Sequence[int], hs: Sequence[int], runs: Path) -> None:
    print("\n## gm vs data-parallel (committed model's held-out loss, nats/char)\n")
    print("| M | H | P | rounds | gm loss | DP loss | gm / DP |")
    print("|---|---|---|---|---|---|---|")
    for m in learners:
        dp: float | None = None
        for h in hs:
            spec = with_sync_every(attrs.evolve(base, learners=m), h)
            got = measure(spec, runs, baseline=dp is None)
            dp = got.baseline_loss if dp is None else dp
            assert dp is not None
            print(
                f"| {m} | {h} | {spec.gm.fragments} | {got.rounds} | {got.loss:.4f} | {dp:.4f} "
                f"| {got.loss / dp:.4f} |",
                flush=True,
            )


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
    parser.add_argument("--steps", type=int, default=DemoSpec().steps)
    parser.add_argument("--learners", type=_ints, default=[2, 4])
    parser.add_argument("--sync-every", type=_ints, default=[10, 30, 100])
    parser.add_argument("--formats", default="BF16,F8_E4M3,F4_E2M1")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-loss"))
    args = parser.parse_args(argv)
    if importlib.util.find_spec("gm_shell.session") is None:
        print("bench_loss: gm_shell.session does not exist yet (issue #6): nothing to measure")
        return 2
    base = attrs.evolve(DemoSpec(), inner=attrs.evolve(DemoSpec().inner, steps=args.steps))
    print(f"# bench_loss: {base.steps} steps per learner, demo spec otherwise")
    loss_rows(base, args.learners, args.sync_every, args.runs)
    format_rows(base, [f for f in args.formats.split(",") if f], args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
