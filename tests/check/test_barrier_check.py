"""The barrier's exhaustive check: it passes at small bounds (every interleaving, every
relative speed of the parties' clocks, a lost response, a crash and restart), its state
counts are pinned as a change detector, and planted bugs are found with a shortest trace."""

from __future__ import annotations

import pytest
from pins import check_pinned

from gm_core import barrier
from gm_core.check.barrier import BarrierBounds, explore

BOUNDS = {
    "two parties": (BarrierBounds(parties=2, waiters=2, timeout_s=1.5), 5_533),
    "one party, two waiters overflow": (BarrierBounds(parties=1, waiters=2, timeout_s=1.5), 10_253),
    "two parties, a lost response": (
        BarrierBounds(parties=2, waiters=2, timeout_s=1.5, losses=1),
        22_766,
    ),
}
SLOW_BOUNDS = {
    "two parties, a crash and restart": (
        BarrierBounds(parties=2, waiters=2, timeout_s=1.5, crashes=1),
        51_694,
    ),
}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_barrier_check_passes_and_state_counts_are_pinned(name: str) -> None:
    check_pinned(explore, BOUNDS, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_BOUNDS))
def test_barrier_check_passes_with_crashes(name: str) -> None:
    check_pinned(explore, SLOW_BOUNDS, name)


def test_releasing_one_arrival_early_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    real = barrier.is_full
    monkeypatch.setattr(barrier, "is_full", lambda arrived, parties: real(arrived + 1, parties))
    outcome = explore(BarrierBounds(parties=2, waiters=2, timeout_s=1.5))
    assert outcome.violation == ("p0 found generation 0 released for ('p0',)",)
    assert len(outcome.trace) == 4


def test_a_marker_naming_every_arrival_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def everyone(state: barrier.BarrierState) -> tuple[str, ...]:
        return tuple(sorted({*state.arrived, state.spec.party}))

    monkeypatch.setattr(barrier, "_members", everyone)
    outcome = explore(BarrierBounds(parties=1, waiters=2, timeout_s=1.5))
    assert outcome.violation == ("p0 found generation 0 released for ('p0', 'p1')",)
    assert len(outcome.trace) == 6
