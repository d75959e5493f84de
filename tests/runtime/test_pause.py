"""A learner pauses for seconds mid-run (an eval pass, a checkpoint): the tape barely notices.

Two learners on threads, 20 ms steps, a round every 10 steps; learner ``a`` stops
for 3 s (150 of its steps) once undeclared and once inside ``Session.pause()``.
Either way ξ_step and the grace window in the round records once ``a`` is back
stay within 40% of their values before the pause: the pause's share is at most
10%, the rest is this shared machine's noise. With the plain EMAs of before, the
undeclared pause read 2.6× and 2.4×: its one report carried 3 s into ξ_step.
``bench/bench_pause.py`` runs the same with a 40 s pause.

What is held to that bound are the two records after the round ``a`` came back in,
not every later one: the estimates are EMAs, so whatever the pause put in shows
first there and only decays after. The later rounds (a dozen or more) add nothing
about the pause, only this shared machine's load swings over a 10-15 s run, held
against a median taken before them: the likely way this test failed under load
(not reproduced: 4 runs at load ~20 passed, the largest later record 1.17× the
median before).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pause_run import run, summary


@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "session.pause"])
def test_a_pause_is_forgotten_within_one_round(tmp_path: Path, declared: bool) -> None:
    bucket = tmp_path / "bucket"
    tape = run(bucket, steps=300, step_s=0.02, pause_at=120, pause_s=3.0, declared=declared)
    got = summary(tape)
    assert got["rounds_without_a"] >= 1, got  # rounds closed while a was away
    for when in ("back", "next"):
        assert got[f"step_s_{when}"] <= 1.4 * got["step_s_before"], got
        assert got[f"grace_s_{when}"] <= 1.4 * got["grace_s_before"] + 1e-3, got
