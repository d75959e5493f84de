"""bench/bench_queue.py still measures both modes: a tiny run whose figures must come out
whole (a time per mode, the ideal, four final losses, where each node's time went), not what
they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.slow
def test_bench_queue_measures_the_queue_and_the_ranks(
    run_bench: Callable[..., dict[str, Any]],
) -> None:
    tiny = ("--units", "8", "--batches", "2", "--step-s", "0.01")
    figures = run_bench("bench/bench_queue.py", *tiny)
    for mode in ("queue", "ranks"):
        (row,) = figures[mode]
        assert row["mode"] == mode
        assert row["took_s"] > 0
        assert row["ideal_s"] > 0
        assert len(row["loss"]) == 4
        assert len(row["spent_s"]) == 4
        assert row["over_paced_ideal"] > 0
        assert all(
            set(n) == {"start", "work", "session_step", "between", "want", "tail", "waits"}
            for n in row["spent_s"]
        )


def test_bench_queue_simulates_both_splits(run_bench: Callable[..., dict[str, Any]]) -> None:
    tiny = ("--sim", "--units", "8", "--batches", "2", "--grace-seconds", "0.1")
    rows = run_bench("bench/bench_queue.py", *tiny)["sim"]
    assert [r["mode"] for r in rows] == ["sim queue", "sim ranks"]
    for row in rows:
        assert row["took_s"] >= row["ideal_s"] > 0
        assert sum(row["steps_slow_slow_fast_fast"]) == 16
