"""Progress lines and the spec file survive their round trips; torn or unknown input is handled."""

from __future__ import annotations

import json
from pathlib import Path

import cattrs
import pytest

from gm_shell.demo import progress, spec
from gm_shell.demo.display import render


def test_progress_lines_round_trip_and_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines: list[progress.Line] = [
        progress.Trained(step=10, loss=2.5, elapsed_s=1.0, round=3),
        progress.Evaluated(step=10, tokens=640, loss=2.4),
        progress.Noted(name="took_over", detail="x"),
        progress.Finished(steps=10, tokens=640, compute_s=0.5, wall_s=1.5, requests={"a": 1}),
    ]
    with progress.ProgressWriter(path) as out:
        for line in lines:
            out.write(line)
    with path.open("a") as f:
        f.write('{"kind": "trained", "st')
    assert progress.read_lines(path) == lines
    assert progress.read_lines(tmp_path / "absent.jsonl") == []


def test_view_folds_the_newest_position_and_every_evaluation() -> None:
    seen = progress.view(
        [
            progress.Trained(step=1, loss=3.0, elapsed_s=0.1),
            progress.Evaluated(step=1, tokens=64, loss=3.1),
            progress.Trained(step=2, loss=2.0, elapsed_s=0.2),
        ]
    )
    assert seen.trained == progress.Trained(step=2, loss=2.0, elapsed_s=0.2)
    assert len(seen.evals) == 1
    assert seen.finished is None
    frame = render("head", {"learner-0": seen}, total=4)
    assert frame[0] == "head"
    assert "2/4" in frame[1]
    assert "eval  3.100" in frame[1]


def test_spec_round_trips_and_unknown_fields_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    original = spec.tiny(learners=3)
    spec.save(original, path)
    assert spec.load(path) == original
    body = json.loads(path.read_text())
    body["gm"]["sync_evry"] = 5
    path.write_text(json.dumps(body))
    with pytest.raises(cattrs.BaseValidationError):
        spec.load(path)
