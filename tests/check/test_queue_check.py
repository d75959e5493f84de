"""The shared queue's and the ranks' exhaustive check (:mod:`gm_core.check.queue`): it
passes at small bounds — every interleaving, every relative speed of the nodes' clocks
(a node that neither waits nor renews looks dead to its peer), lost responses, crashes
with same-id restarts, watches of a rank — its state counts are pinned as a change
detector, and planted bugs are found with a shortest trace."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from pins import check_pinned, coordination_table

from gm_core import queue
from gm_core.check.bounds import COORDINATION_BOUNDS
from gm_core.check.queue import QueueBounds, explore
from gm_shell import check_cli

PINNED = {
    "queue: one node, two units, a crash and restart": 296,
    "queue: one node, two units, prefetch 1, a crash": 292,
    "queue: one node, two units, two lost responses": 783,
    "queue: two nodes race for one unit": 29_555,
    "ranks: one node, two ranks, a crash, a watch": 685,
}
"""States of the queue's and the ranks' sets ``gm check --ci`` explores."""
BOUNDS = coordination_table(QueueBounds, PINNED)


@pytest.mark.parametrize("name", list(BOUNDS))
def test_queue_check_passes_and_state_counts_are_pinned(name: str) -> None:
    check_pinned(explore, BOUNDS, name)


def test_every_queue_set_is_pinned() -> None:
    assert set(BOUNDS) == set(PINNED)  # a set without a pin runs with -1 and fails


def never_superseded(attempt: int, claims: Iterable[int]) -> bool:
    return False


@pytest.mark.parametrize("ranked", [False, True])
def test_a_holder_that_never_sees_it_was_superseded_is_found(
    monkeypatch: pytest.MonkeyPatch, ranked: bool
) -> None:
    """A rank kept by two nodes: the one judged dead is still told it holds it."""
    monkeypatch.setattr(queue, "superseded", never_superseded)
    outcome = explore(QueueBounds(nodes=2, units=1, ranks=ranked, watches=1))
    unit = "0000" if ranked else "u0"
    assert outcome.violation == (
        f"n0 told it holds {unit} under claim 0 while claim 1 of n1 was the highest",
    )
    assert len(outcome.trace) == 15


def test_a_restarted_node_that_does_not_resume_its_own_unit_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its unit stays claimed by a live node (itself) for ever: nobody trains it."""
    real = queue.choose

    def not_mine(units: Iterable[str], **named: object) -> tuple[tuple[str, int], ...]:
        holders = named["holders"]
        assert isinstance(holders, dict)
        picks = real(units, **named)  # type: ignore[arg-type]
        return tuple(p for p in picks if holders.get(p[0]) != named["me"])

    monkeypatch.setattr(queue, "choose", not_mine)
    outcome = explore(QueueBounds(nodes=1, units=2, crashes=1))
    assert outcome.violation == (
        "a fair run does not come to rest in 5000 steps",
        "units never done: ('u0',)",
    )
    assert ("crash", 0) in outcome.trace


def test_gm_check_ci_runs_the_coordination_sets_and_prints_a_planted_bug_with_its_trace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "queue: one node, two units, a crash and restart"
    outcome = check_cli.run(name, COORDINATION_BOUNDS[name], quiet=True)
    assert (outcome.verdict, outcome.states) == ("pass", PINNED[name])
    assert capsys.readouterr().out.startswith(f"{name}: PASS  296 states;")
    monkeypatch.setattr(queue, "superseded", never_superseded)
    planted = check_cli.run("planted", QueueBounds(nodes=2, units=1, ranks=True, watches=1))
    printed = capsys.readouterr().out
    assert planted.verdict == "violation"
    assert "violated: n0 told it holds 0000 under claim 0" in printed
    assert "shortest trace (15 actions)" in printed
    assert check_cli.summary_line([outcome, planted]).startswith("1/2 bound sets PASS, 1 VIOLATION")
    assert check_cli.EXIT[planted.verdict] == 1
