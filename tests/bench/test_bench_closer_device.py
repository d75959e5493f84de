"""bench/bench_closer_device.py still measures what it says: a tiny run of every path.

Its figures are timings and stay out of the suite; this keeps the code that produces them
working, and checks that the two torch paths (host decode before, device decode now) end
on the same theta bit for bit in every wire format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_bench_closer_device_smoke(run_bench: Callable[..., dict[str, Any]]) -> None:
    figures = run_bench("-m", "bench.bench_closer_device", "--mib", "1", "--repeat", "1")

    assert set(figures) == {"F32", "BF16", "F8_E4M3", "F4_E2M1"}
    for wire in figures.values():
        assert wire["same_theta"] is True
        for path in ("numpy", "torch, host decode", "torch, on device"):
            assert wire[path]["best_s"] > 0
