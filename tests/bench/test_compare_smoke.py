"""bench/compare.py still measures gm's side: its smoke run, every figure at a tiny size.

The benchmark is not part of the suite (it takes minutes and its figures are timings); this
keeps the code that produces them working. It runs gm's real runtime (Sessions over the slow
in-memory bucket, the payload codecs, the merge) and checks each figure came out whole — no
error, every count and time present and positive — not what the figures are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_compare_smoke_measures_every_gm_figure(run_bench: Callable[..., dict[str, Any]]) -> None:
    figures = run_bench("bench/compare.py", "--smoke", "--gm-only")

    requests = figures["requests"]["gm"]
    assert "error" not in requests, requests
    assert requests["window_rounds"] >= 1
    assert requests["per_round"]["PUT"] > 0
    assert requests["participants_per_round"] > 0

    path = figures["critical_path"]["gm"]
    assert "error" not in path, path
    assert [row["latency_ms"] for row in path["results"]] == [0.0, 5.0]
    assert all(row["round_s_median"] > 0 and row["rounds_timed"] >= 1 for row in path["results"])
    assert path["results"][1]["slope_requests"] is not None

    join = figures["join"]["gm"]
    assert "error" not in join, join
    for side in join["join"].values():
        assert side["requests"]["GET"] > 0
    for side in join["takeover"].values():
        assert side["to_commit"]["PUT"] > 0
        assert side["seconds_to_commit"] >= side["seconds_to_claim"] > 0

    for rule in ("mean", "rda"):
        merge = figures["merge"][rule]["gm"]
        assert all("error" not in side and side["best_s"] > 0 for side in merge.values()), merge

    step = figures["step"]["gm"]
    assert step["session"]["median_us"] > 0
