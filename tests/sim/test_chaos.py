"""The paper's goodput table: our failure model beside the Decoupled DiLoCo paper's numbers.

The DP and elastic-DP rows are Monte Carlo and fast, so every cell is checked in
the default suite; the learner rows run the real protocol and take a while, so
one cell per row is checked here and the whole table under ``make test-long``.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from gm_core.sim import chaos

TOLERANCE = 5.0


@pytest.mark.parametrize("row", ["DP", "elastic DP"])
def test_dp_rows_are_within_five_points_of_the_paper(row: str) -> None:
    for chips in chaos.CHIPS:
        cell = chaos.cell(row, chips)
        assert abs(cell.error) <= TOLERANCE, cell


@pytest.mark.parametrize(("row", "chips"), [("M=2", 2_400_000)])
def test_a_learner_cell_is_within_five_points_of_the_paper(row: str, chips: int) -> None:
    cell = chaos.cell(row, chips)
    assert abs(cell.error) <= TOLERANCE, cell
    assert cell.committed is not None
    assert cell.committed <= cell.goodput + 0.01


@pytest.mark.slow
def test_whole_table_is_within_five_points_of_the_paper() -> None:
    table = chaos.table()
    assert table.worst_error <= TOLERANCE, [c for c in table.cells if abs(c.error) > TOLERANCE]


def test_cells_are_reproducible_from_their_seed() -> None:
    assert chaos.cell("DP", 300_000, seed=3) == chaos.cell("DP", 300_000, seed=3)


@given(
    st.integers(1_000, 3_000_000),
    st.floats(1.0, 100.0),
    st.floats(0.01, 5.0),
    st.integers(0, 2**32 - 1),
)
def test_outages_never_overlap_and_goodput_is_a_share(
    chips: int, restart_s: float, checkpoint_s: float, seed: int
) -> None:
    horizon = 2_000.0 * chaos.YEAR_S / chips
    o = chaos.group_outages(
        chips, restart_s, checkpoint_s, chaos.YEAR_S, horizon, np.random.default_rng(seed)
    )
    ends = [s + d for s, d in zip(o.starts, o.lengths, strict=True)]
    assert all(e <= s * (1 + 1e-12) + 1e-9 for e, s in zip(ends, o.starts[1:], strict=False))
    assert all(d >= restart_s - 1e-9 for d in o.lengths)
    assert 0.0 <= o.goodput(horizon) <= 1.0


def test_more_chips_never_help_a_data_parallel_job() -> None:
    rng = np.random.default_rng(0)
    dp = [chaos.dp_goodput(n, False, chaos.CALIBRATED, rng) for n in chaos.CHIPS]
    assert dp == sorted(dp, reverse=True)
