"""bench/bench_auth.py still measures what it says: its smoke run, every part at a tiny size.

The benchmark's figures are timings and stay out of the suite; this keeps the code that
produces them working. It runs the real envelope and digests, and real Sessions over
file:// buckets open and authenticated, and checks every figure came out whole (present
and positive, both sides, every algorithm), not what the figures are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def test_bench_auth_smoke_measures_every_figure(run_bench: Callable[..., dict[str, Any]]) -> None:
    figures = run_bench("-m", "bench.bench_auth", "--smoke")

    for samples in figures["hashing"].values():
        assert set(samples) == {
            "seal (HMAC-SHA256)",
            "open (HMAC-SHA256)",
            "seal signed (Ed25519)",
            "open signed (Ed25519)",
            "HMAC-SHA256 alone",
            "BLAKE3 keyed",
            "BLAKE3",
            "SHA-256",
        }
        assert all(s > 0 for seconds in samples.values() for s in seconds)
    assert all(s > 0 for seconds in figures["payload"].values() for s in seconds)

    runs = figures["runs"]
    for side in ("open", "keyed", "signed"):
        (step,) = runs[f"step {side}"]
        assert step["rounds"] >= 1
        assert step["tagged"] is (side != "open")
        for latency in ("0ms", "2ms"):  # the smoke run's store latencies
            (path,) = runs[f"path {latency} {side}"]
            assert path["round_ms"] > 0
            assert path["rounds_timed"] >= 1
            assert path["by_class"]["PUT"] > 0
            assert path["by_class"]["GET"] > 0
            assert path["tagged"] is (side != "open")
            assert path["loop_cpu_ms"] > 0
            # the closer's loop thread opened its learners' snapshots, sealed records, a head
            parts = path["envelope_parts_us"]
            assert {"open snapshot", "seal round", "seal head"} <= set(parts)
            assert all(us > 0 for us in parts.values())
            assert path["envelope_us"] == pytest.approx(sum(parts.values()))
            signed = side == "signed"
            for run in (step, path):  # signatures are made and checked on the signed side only
                assert (run["signs"] > 0 and run["verifies"] > 0) is signed
                assert (run["signs"] == 0 and run["verifies"] == 0) is not signed
