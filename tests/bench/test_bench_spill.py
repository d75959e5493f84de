"""bench/bench_spill.py still measures what it says: a tiny run of both modes.

Its figures are timings and memory, and stay out of the suite; this keeps the code that
produces them working: real Readers over a file:// mailbox, spilling and not, and every
figure present for each mode's rounds (not what the figures are).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_bench_spill_measures_both_modes(run_bench: Callable[..., dict[str, Any]]) -> None:
    runs = run_bench(
        "-m", "bench.bench_spill", "--mib", "0.5", "--learners", "2", "--rounds", "3",
        "--repeat", "1",
    )  # fmt: skip
    assert set(runs) == {"spill", "memory"}
    for mode, (run,) in runs.items():
        assert run["mode"] == mode
        assert len(run["reads"]) == len(run["merges"]) == 2  # the first round is a warm-up
        assert all(t > 0 for t in run["reads"] + run["merges"])
        assert run["peak_growth"] >= 0
