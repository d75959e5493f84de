"""bench/bench_groups.py and bench/bench_staging.py still measure: tiny runs, every figure
whole (positive times, the follower's steps counted), not what the figures are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_bench_groups_measures_step_and_fragment_figures(
    run_bench: Callable[..., dict[str, Any]],
) -> None:
    figures = run_bench("bench/bench_groups.py", "--steps", "60", "--rounds", "2", "--mib", "1")
    for side, key in (
        ("leader", "group_step"),
        ("follower", "group_step"),
        ("single", "single_step"),
    ):
        row = figures[side][key]
        assert row["mean_us"] > 0, (side, row)
        assert row["checks"] >= 1, (side, row)
    for kind in ("ddp_fragment", "fsdp2_fragment"):
        assert figures["leader"][kind]["capture_s"] > 0
        assert figures["leader"][kind]["align_s"] > 0
    assert figures["single"]["single_fragment"]["align_s"] > 0


def test_bench_staging_compares_the_adapter_before_and_after(
    run_bench: Callable[..., dict[str, Any]],
) -> None:
    figures = run_bench("bench/bench_staging.py", "--sizes", "1", "--repeat", "1", "--rounds", "2")
    assert [(r["mib"], r["dtype"]) for r in figures["rows"]] == [(1, "float32"), (1, "bfloat16")]
    for row in figures["rows"]:
        assert row["capture_s_before"] > 0
        assert row["align_s_after"] > 0
