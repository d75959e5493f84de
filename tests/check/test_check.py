"""The model checker: it passes at the CI bounds, its state counts are pinned, and it can fail.

``gm check --ci`` runs here, inside ``make test``: every invariant in every state
of four small bound sets, with bounded progress. The numbers of states explored
are pinned, so any change to the protocol's transitions — intended or not —
shows up as a changed count to explain. Two tests plant a bug in the closer by
monkeypatching one of its functions and assert the checker finds it and prints
a shortest trace that replays.
"""

from __future__ import annotations

import argparse

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import given

from gm_core import closer, cluster
from gm_core.check import actions
from gm_core.check.explore import Bounds, explore, initial_state, narrate
from gm_core.check.fingerprint import Fingerprinter, fingerprint
from gm_core.commands import Command, PutOnce
from gm_core.records import Reason
from gm_shell import check_cli

PINNED = {
    "one node, one fault": 7_651,
    "one node, one crash": 5_268,
    "learner and closer apart": 2_744,
    "two learners, one closes": 1_435,
    "two closers race for round 0": 1_470,
    "two closers race, one fault": 13_082,
}
PINNED_LONG = {
    "two closers race through a poll": 433_682,
    "two learners, one closes, through a poll": 275_051,
    "one node, two rounds": 578_624,
}
"""States explored at the CI bounds. If a protocol change moves these, check that the
change was meant, then update the numbers in the same commit."""


def test_gm_check_passes_at_ci_bounds_and_state_counts_are_pinned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counts = {}
    for name, bounds in check_cli.CI_BOUNDS.items():
        outcome = check_cli.run(name, bounds, quiet=True)
        assert outcome.verdict == "pass", capsys.readouterr().out
        counts[name] = outcome.states
    report = capsys.readouterr().out
    print(report)
    assert "states/s" in report
    assert counts == PINNED


@pytest.mark.slow
def test_larger_bounds_pass_and_are_pinned(capsys: pytest.CaptureFixture[str]) -> None:
    counts = {}
    for name, bounds in check_cli.LONG_BOUNDS.items():
        outcome = check_cli.run(name, bounds, quiet=True)
        assert outcome.verdict == "pass", capsys.readouterr().out
        counts[name] = outcome.states
    print(capsys.readouterr().out)
    assert counts == PINNED_LONG


# --- planted bugs ------------------------------------------------------------------------------


@pytest.fixture
def takeover_without_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower that decides to take over opens the round at once instead of bidding."""
    real = closer._follow

    def follow(state: closer.CloserState, now_s: float, cmds: list[Command]) -> closer.CloserState:
        before = len(cmds)
        state = real(state, now_s, cmds)
        if state.phase is not closer.Phase.CLAIMING:
            return state
        for cmd in [c for c in cmds[before:] if isinstance(c, PutOnce)]:
            cmds.remove(cmd)
        return closer._open(state, now_s, 0, cmds)

    monkeypatch.setattr(closer, "_follow", follow)


RACE = check_cli.CI_BOUNDS["two closers race for round 0"]


@pytest.mark.usefixtures("takeover_without_claim")
def test_checker_finds_a_takeover_without_a_claim(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = check_cli.run("planted: takeover without a claim", RACE, quiet=True)
    printed = capsys.readouterr().out
    print(printed)
    assert outcome.verdict == "violation"
    example = outcome.counterexample
    assert example is not None
    assert {v.invariant for v in example.violations} == {"single_committer"}
    assert "committed without a claim" in printed
    assert "replay: gm check --roles lc,c --rounds 1 --max-time 0.5 --replay d:" in printed
    # The trace replays to the same broken state.
    assert check_cli.replay(RACE, example.replay_arg()) == 1
    assert "VIOLATED single_committer" in capsys.readouterr().out


@pytest.mark.usefixtures("takeover_without_claim")
def test_counterexample_is_a_shortest_one() -> None:
    """Breadth first: no shorter path reaches the violation (checked on a prefix bound)."""
    outcome = explore(RACE)
    assert outcome.counterexample is not None
    length = len(outcome.counterexample.tokens)
    lines, end = narrate(RACE, tuple(actions.parse(t) for t in outcome.counterexample.tokens))
    assert end is not None
    assert len(lines) == length + 1
    assert outcome.depth == length - 1


@pytest.mark.slow
def test_checker_finds_a_closer_accepting_zero_step_snapshots(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = closer._judge

    def judge(state: closer.CloserState, learner: str, snapshot: object) -> Reason | None:
        reason = real(state, learner, snapshot)  # type: ignore[arg-type]
        return None if reason is Reason.ZERO_STEPS else reason

    monkeypatch.setattr(closer, "_judge", judge)
    outcome = check_cli.run("planted: zero steps", Bounds(roles=("lc",), rounds=2, max_time_s=2.0))
    print(capsys.readouterr().out)
    assert outcome.verdict != "pass"
    assert outcome.counterexample is not None


# --- the pieces ----------------------------------------------------------------------------------


def test_cli_replay_command_round_trips_the_bounds() -> None:
    parser = argparse.ArgumentParser()
    check_cli.register(parser)
    command = check_cli.replay_command(RACE, "w")
    args = parser.parse_args(command.split()[2:])
    assert check_cli.bounds_of(args) == RACE
    assert args.replay == "w"


def test_fingerprint_ignores_in_flight_order_and_notes() -> None:
    c = initial_state(Bounds(roles=("lc", "l")))
    assert len(c.inflight) > 2
    reordered = attrs.evolve(c, inflight=tuple(reversed(c.inflight)), notes=())
    assert fingerprint(reordered) == fingerprint(c)
    assert Fingerprinter().state(c) == fingerprint(c)


def test_fingerprint_sees_every_real_difference() -> None:
    c = initial_state(Bounds(roles=("lc", "l")))
    first = actions.enabled(
        c, faults_left=0, crashes_left=0, store_faults_only=True, max_time_s=1.0
    )[0]
    assert fingerprint(actions.apply(c, first)) != fingerprint(c)
    assert fingerprint(attrs.evolve(c, now_s=0.5)) != fingerprint(c)


def test_etags_count_only_as_current_or_old() -> None:
    """Two writes to different keys commute once etags are judged by equality alone."""
    c = initial_state(Bounds(roles=("lc", "l")))
    writes = [a for a in actions.deliveries(c, 0, True) if "PutOver" in actions.describe(c, a)]
    assert len(writes) >= 2
    one = actions.apply(actions.apply(c, writes[0]), writes[1])
    two = actions.apply(actions.apply(c, writes[1]), writes[0])
    assert one.store.writes == two.store.writes
    assert one.store != two.store  # the etags differ ...
    assert fingerprint(one) == fingerprint(two)  # ... and nothing can tell


tokens = st.one_of(
    st.just(actions.Action(kind=actions.Kind.TICK)),
    st.builds(
        actions.Action,
        kind=st.sampled_from([actions.Kind.TRAIN, actions.Kind.CRASH, actions.Kind.RESTART]),
        node=st.sampled_from(["n0", "n1", "n12"]),
    ),
    st.builds(
        actions.Action,
        kind=st.just(actions.Kind.FIRE),
        node=st.sampled_from(["n0", "n1"]),
        machine=st.sampled_from(list(cluster.Machine)),
    ),
    st.builds(
        actions.Action,
        kind=st.just(actions.Kind.DELIVER),
        node=st.sampled_from(["n0", "n1"]),
        machine=st.sampled_from(list(cluster.Machine)),
        incarnation=st.integers(0, 9),
        req=st.integers(0, 10_000),
        fault=st.sampled_from(list(cluster.Fault)),
    ),
)


@given(tokens)
def test_action_tokens_round_trip(action: actions.Action) -> None:
    assert actions.parse(action.token()) == action
