"""A tiny demo end to end: two learner processes and the baseline through a file:// mailbox."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gm_shell.demo import corpus, launch, progress
from gm_shell.demo.committed import COMMITTED
from gm_shell.demo.spec import tiny


def test_tiny_demo_completes_and_writes_plot_and_summary(tmp_path: Path) -> None:
    spec = tiny(learners=2)
    out = io.StringIO()
    summary = launch.run_demo(spec, tmp_path, out)
    run = tmp_path / spec.name
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((run / "summary.json").read_text())
    assert saved["tape"]["rounds"] == summary.tape.rounds > 0
    assert summary.tape.learners == ("learner-0", "learner-1")
    assert summary.trained_tokens == spec.tokens_at(spec.steps)
    assert summary.requests.put_requests > 0
    # Both sides learned something in 40 steps (the ratio of so short a run means little).
    assert summary.gm_loss < corpus.uniform_entropy_nats() - 0.5
    assert summary.baseline_loss < corpus.uniform_entropy_nats() - 0.5
    assert "gm / data-parallel" in out.getvalue()
    url = (run / "mailbox").as_uri()
    assert out.getvalue().startswith(f"mailbox: {url}\nwatch it: gm status {url}\n")
    assert f"the run's tape: gm status {url}\n" in out.getvalue()
    # The plot's gm curve: commits scored as they came, ending with the final commit.
    committed = progress.view(progress.read_lines(run / "progress" / f"{COMMITTED}.jsonl"))
    assert committed.evals[-1].loss == summary.gm_loss
    assert committed.evals[-1].tokens == spec.tokens_at(spec.steps)
    xs = [e.tokens for e in committed.evals]
    assert xs == sorted(xs)
