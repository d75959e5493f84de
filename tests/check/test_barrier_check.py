"""The barrier's exhaustive check: it passes at small bounds (every interleaving, every
relative speed of the parties' clocks, a lost response, a crash and restart), its state
counts are pinned as a change detector, and planted bugs are found with a shortest trace."""

from __future__ import annotations

import pytest
from pins import check_pinned, coordination_table

from gm_core.check.barrier import BarrierBounds, explore
from gm_core.check.plants import PLANTS, planted

PINNED = {
    "barrier: two parties": 5_533,
    "barrier: one party, two waiters overflow": 10_253,
    "barrier: two parties, a lost response": 22_766,
    "barrier: two parties, a crash and restart": 51_694,
}
"""States of the barrier's sets ``gm check --ci`` explores."""
BOUNDS = coordination_table(BarrierBounds, PINNED)


@pytest.mark.parametrize("name", list(BOUNDS))
def test_barrier_check_passes_and_state_counts_are_pinned(name: str) -> None:
    check_pinned(explore, BOUNDS, name)


def test_every_barrier_set_is_pinned() -> None:
    assert set(BOUNDS) == set(PINNED)  # a set without a pin runs with -1 and fails


def test_releasing_one_arrival_early_is_found() -> None:
    plant = PLANTS["barrier-releases-one-early"]
    with planted(plant):
        outcome = explore(plant.bounds)
    assert outcome.violation == ("p0 found generation 0 released for ('p0',)",)
    assert len(outcome.trace) == 4


def test_a_marker_naming_every_arrival_is_found() -> None:
    plant = PLANTS["barrier-names-every-arrival"]
    with planted(plant):
        outcome = explore(plant.bounds)
    assert outcome.violation == ("p0 found generation 0 released for ('p0', 'p1')",)
    assert len(outcome.trace) == 6
