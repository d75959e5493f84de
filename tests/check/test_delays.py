"""The delay-bounded search (``Bounds.delays``): what it explores, and that it is a subset of
the exhaustive search that grows to all of it.

A delay is a step off the fair schedule (:func:`gm_core.check.progress.fair_action`): with
none the search is the fair run alone; with enough it is the exhaustive search. The sets in
``gm check --ci`` that name their delays reach four rounds or a crashed either-role closer
across two rounds, which the exhaustive search cannot in CI time.
"""

from __future__ import annotations

import attrs
import pytest

from gm_core.check.bounds import CI_BOUNDS, DEEP_BOUNDS
from gm_core.check.explore import Bounds, explore
from gm_shell import check_cli

FOUR_ROUNDS = CI_BOUNDS["three nodes, two fragments, four rounds, the closer crashes (1 delay)"]


def test_no_delay_is_the_fair_run_alone_and_it_reaches_four_rounds() -> None:
    outcome = explore(attrs.evolve(FOUR_ROUNDS, delays=0))
    assert outcome.verdict == "pass"
    assert outcome.max_records == 4
    assert outcome.transitions == outcome.states - 1  # one path: no state has two successors
    assert outcome.depth == outcome.states  # one state per layer


@pytest.mark.parametrize(
    "bounds",
    [
        CI_BOUNDS["two learners, one closes"],
        CI_BOUNDS["one node, one crash"],
        CI_BOUNDS["two closers race, one fault"],
    ],
    ids=["two learners", "a crash and restart", "two closers, one fault"],
)
def test_more_delays_reach_more_states_until_every_state_of_the_full_search(
    bounds: Bounds,
) -> None:
    full = explore(bounds)
    reached = [explore(attrs.evolve(bounds, delays=k)).distinct for k in (0, 1, 2)]
    assert reached[0] < reached[1] < reached[2] < full.distinct
    unbounded = explore(attrs.evolve(bounds, delays=full.depth + 1))
    assert unbounded.distinct == full.distinct
    assert unbounded.verdict == full.verdict == "pass"


def test_a_counterexample_found_with_delays_replays_without_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bug two delays deep: the closing rule counting one snapshot too many."""
    from gm_core.check.plants import PLANTS, planted

    plant = PLANTS["quorum-off-by-one"]
    bounds = attrs.evolve(plant.bounds, delays=2)
    with planted(plant):
        outcome = check_cli.run("quorum", bounds, quiet=True)
        assert outcome.verdict == "violation"
        assert outcome.counterexample is not None
        assert check_cli.replay(bounds, outcome.counterexample.replay_arg()) == 1
    assert "DELAY-BOUNDED" in capsys.readouterr().out


def test_the_delay_budget_is_in_the_replay_command_and_the_bounds_line() -> None:
    bounds = DEEP_BOUNDS["three nodes, two fragments, four rounds, the closer crashes (2 delays)"]
    assert "--delays 2" in check_cli.replay_command(bounds, "")
    assert "at most 2 delays" in check_cli.describe_bounds(bounds)
