"""The data-parallel baseline learns: held-out loss falls well within a few dozen steps."""

from __future__ import annotations

from pathlib import Path

from gm_shell.demo import progress
from gm_shell.demo.baseline import run_baseline
from gm_shell.demo.spec import tiny
from gm_shell.demo.stream import TokenStream


def test_baseline_loss_decreases_and_reports_progress(tmp_path: Path) -> None:
    spec = tiny()
    path = tmp_path / "baseline.jsonl"
    with progress.ProgressWriter(path) as out:
        run_baseline(spec, TokenStream(spec.data), out)
    seen = progress.view(progress.read_lines(path))
    evals = seen.evals
    assert [e.step for e in evals] == list(range(0, spec.steps + 1, spec.eval_every))
    assert evals[-1].tokens == spec.steps * spec.learners * spec.data.tokens_per_batch
    assert evals[-1].loss < evals[0].loss - 0.5
    assert seen.finished is not None
    assert seen.finished.steps == spec.steps
    assert seen.trained is not None
    assert seen.trained.step == spec.steps
