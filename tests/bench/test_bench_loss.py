"""bench/bench_loss.py's arithmetic: a curve's loss between evaluations, gm/DP along a run.

The benchmark's runs take hours here and are not part of the suite; these pin down how
its table reads the curves those runs leave (interpolation, which cells exist).
"""

from __future__ import annotations

import attrs
import pytest
from bench.bench_loss import Measured, Point, curve_table, loss_at
from hypothesis import given
from hypothesis import strategies as st

from gm_shell.demo.progress import Evaluated
from gm_shell.demo.spec import DemoSpec


def curve(steps: int, loss: float, slope: float, learners: int = 2) -> tuple[Evaluated, ...]:
    spec = attrs.evolve(DemoSpec(), learners=learners)
    return tuple(
        Evaluated(step=k, tokens=spec.tokens_at(k), loss=loss - slope * k)
        for k in range(0, steps + 1, 25)
    )


@given(st.integers(0, 10_000), st.floats(1.0, 5.0))
def test_loss_at_is_linear_between_evaluations_and_none_outside(tokens: int, loss: float) -> None:
    points = (Evaluated(step=0, tokens=0, loss=loss), Evaluated(step=1, tokens=5_000, loss=1.0))
    got = loss_at(points, tokens)
    if tokens > 5_000:
        assert got is None
    else:
        assert got == pytest.approx(loss + (1.0 - loss) * tokens / 5_000)


def test_the_curve_table_reads_each_run_at_its_end_and_along_the_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gm = Measured(loss=1.2, rounds=9, delta_bytes=None, curve=curve(2400, 3.0, 1e-3))
    long = Point(learners=2, sync_every=30, steps=2400, gm=gm, baseline=curve(2400, 2.0, 0))
    short = Point(
        learners=2,
        sync_every=30,
        steps=800,
        gm=attrs.evolve(gm, loss=2.2, curve=curve(800, 3.0, 1e-3)),
        baseline=curve(800, 2.0, 0),
    )
    curve_table([long, short], DemoSpec())
    rows = {
        line.split("|")[3].strip(): [c.strip() for c in line.split("|")[4:-1]]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| 2 | 30 |")
    }
    # 800, 1,600 (two thirds of the longest) and 2,400: interpolated along the way,
    # the final evaluations at a run's end, nothing past it.
    assert rows["800"] == ["1.100", "—", "—"]
    assert rows["2,400"] == ["1.100", "0.700", "0.600"]
