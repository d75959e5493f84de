"""The shared queue's and the ranks' exhaustive check (:mod:`gm_core.check.queue`): it
passes at small bounds — every interleaving, every relative speed of the nodes' clocks
(a node that neither waits nor renews looks dead to its peer), lost responses, crashes
with same-id restarts, watches of a rank — its state counts are pinned as a change
detector, and planted bugs are found with a shortest trace."""

from __future__ import annotations

import pytest
from pins import check_pinned, coordination_table

from gm_core.check import queue as checked
from gm_core.check.bounds import COORDINATION_BOUNDS, COORDINATION_LONG_BOUNDS
from gm_core.check.plants import PLANTS, planted
from gm_core.check.queue import QueueBounds, explore
from gm_shell import check_cli

PINNED = {
    "queue: one node, two units, a crash and restart": 296,
    "queue: one node, two units, prefetch 1, a crash": 292,
    "queue: one node, two units, two lost responses": 783,
    "queue: two nodes race for one unit": 29_555,
    "ranks: one node, two ranks, a crash, a watch": 685,
    "ranks: one node, two ranks, it looks when its rank is done": 148,
    "queue: one node, two units, it looks when they are done": 582,
    "queue: an either node elected after a unit, prefetch 1": 1_312,
    "queue: two nodes, one unit, the first to run out looks": 4_685,
    "queue: one node, three units, pipelined, a crash": 1_014,
    "queue: one node, two units, pipelined, two lost responses": 869,
}
"""States of the queue's and the ranks' sets ``gm check --ci`` explores."""
BOUNDS = coordination_table(QueueBounds, PINNED)
PINNED_LONG = {
    "ranks: two nodes contend for one rank, a watch": 73_663,
    "ranks: two nodes contend for one rank, a crash and restart": 191_399,
}
"""States of the two-node ranks sets ``make check-long`` explores (counted in session 12)."""


@pytest.mark.parametrize("name", list(BOUNDS))
def test_queue_check_passes_and_state_counts_are_pinned(name: str) -> None:
    check_pinned(explore, BOUNDS, name)


def test_every_queue_set_is_pinned() -> None:
    assert set(BOUNDS) == set(PINNED)  # a set without a pin runs with -1 and fails


@pytest.mark.slow
@pytest.mark.timeout(3600)  # minutes of CPU each
@pytest.mark.parametrize("name", list(COORDINATION_LONG_BOUNDS))
def test_two_nodes_contending_for_a_rank_pass_and_are_pinned(name: str) -> None:
    """At most one live holder per rank needs two nodes after it: one node cannot break it."""
    bounds = COORDINATION_LONG_BOUNDS[name]
    assert isinstance(bounds, QueueBounds)
    check_pinned(explore, {name: (bounds, PINNED_LONG[name])}, name)


SUPERSEDED = PLANTS["queue-holder-never-superseded"]


@pytest.mark.parametrize("ranked", [False, True])
def test_a_holder_that_never_sees_it_was_superseded_is_found(ranked: bool) -> None:
    """A rank kept by two nodes: the one judged dead is still told it holds it."""
    with planted(SUPERSEDED):
        outcome = explore(QueueBounds(nodes=2, units=1, ranks=ranked, watches=1))
    unit = "0000" if ranked else "u0"
    assert outcome.violation == (
        f"n0 told it holds {unit} under claim 0 while claim 1 of n1 was the highest",
    )
    assert len(outcome.trace) == 15


def test_a_restarted_node_that_does_not_resume_its_own_unit_is_found() -> None:
    """Its unit stays claimed by a live node (itself) for ever: nobody trains it."""
    plant = PLANTS["queue-no-resume"]
    with planted(plant):
        outcome = explore(plant.bounds)
    assert outcome.violation == (
        "a fair run does not come to rest in 5000 steps",
        "units never done: ('u0',)",
    )
    assert ("crash", 0) in outcome.trace


def test_finishing_on_the_claimed_ranks_only_is_found_by_finished_sound_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference's rule: a rank nobody took does not hold the run open. The node leaves
    after rank 0 and looks: finished.json is written with rank 1 not done. No other check
    sees it (the node left; nobody was to train rank 1)."""
    plant = PLANTS["finish-on-claimed-ranks"]
    with planted(plant):
        outcome = explore(plant.bounds)
        assert outcome.violation == ("finished.json written with 0001 not done",)
        assert ("look", 0) in outcome.trace
        monkeypatch.setattr(checked, "_finished_unsound", lambda *a: [])
        assert explore(plant.bounds).violation == ()


def test_an_either_node_keeping_its_prefetched_unit_is_found_by_either_gives_back_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Elected between units, it ends its give-back at once, its claims kept (the shortest
    trace: u0 claimed, a crash and restart, the election). Relieved later it resumes its
    unit, so every unit is still done: only either_gives_back sees that it served holding a
    unit nobody else could take while its lease stayed live."""
    plant = PLANTS["either-keeps-unstarted-claims"]
    with planted(plant):
        outcome = explore(plant.bounds)
        assert outcome.violation == ("n0 serves still holding u0 under claim 0, not started",)
        assert ("elect", 0) in outcome.trace
        monkeypatch.setattr(checked, "_kept", lambda *a: [])
        assert explore(plant.bounds).violation == ()


def test_gm_check_ci_runs_the_coordination_sets_and_prints_a_planted_bug_with_its_trace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = "queue: one node, two units, a crash and restart"
    outcome = check_cli.run(name, COORDINATION_BOUNDS[name], quiet=True)
    assert (outcome.verdict, outcome.states) == ("pass", PINNED[name])
    assert capsys.readouterr().out.startswith(f"{name}: PASS  296 states;")
    with planted(SUPERSEDED):
        found = check_cli.run("planted", QueueBounds(nodes=2, units=1, ranks=True, watches=1))
    printed = capsys.readouterr().out
    assert found.verdict == "violation"
    assert "violated: n0 told it holds 0000 under claim 0" in printed
    assert "shortest trace (15 actions)" in printed
    assert check_cli.summary_line([outcome, found]).startswith("1/2 bound sets PASS, 1 VIOLATION")
    assert check_cli.EXIT[found.verdict] == 1
