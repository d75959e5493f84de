"""bench/bench_groups.py, bench/bench_group_rounds.py and bench/bench_staging.py still
measure: tiny runs, every figure whole (positive times, the follower's steps counted), not
what the figures are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


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


@pytest.mark.slow  # 8 processes (a closer and a learner of 1-2 ranks per case), importing torch
def test_bench_group_rounds_measures_every_case_over_a_real_mailbox(
    run_bench: Callable[..., dict[str, Any]],
) -> None:
    args = ("--mib", "1", "--rounds", "2", "--repeat", "1", "--step-ms", "5")
    figures = run_bench("bench/bench_group_rounds.py", *args)
    assert figures.keys() == {"single", "ddp", "fsdp2"}
    for kind, ranks in figures.items():
        assert ranks.keys() == ({"0"} if kind == "single" else {"0", "1"}), kind
        leader = ranks["0"]
        for name in ("capture_s", "publish_s", "capture_publish_s", "align_s", "step_s"):
            assert leader[name], (kind, name)
            assert min(leader[name]) > 0, (kind, name)
        assert all(t > 0 for rank in ranks.values() for t in rank["step_s"]), kind
