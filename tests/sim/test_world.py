"""The simulator: determinism, what it measures, faults it injects, and its pure helpers."""

from __future__ import annotations

import math

import attrs
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from gm_core import invariants
from gm_core.records import AlgorithmConfig, Alignment
from gm_core.sim import checks, scenario, speed, swarm, world
from gm_core.sim.metrics import Ledger, Span
from gm_core.sim.scenario import (
    CheckPolicy,
    Fault,
    FaultKind,
    Scenario,
    SpeedProfile,
    StoreProfile,
    TrainingSpec,
)


def small(**changes: object) -> Scenario:
    base = Scenario(
        learners=3,
        closers=2,
        duration_s=30.0,
        config=AlgorithmConfig(
            sync_every=6,
            fragments=2,
            quorum=1,
            in_flight=2,
            lease_timeout_s=4.0,
            takeover_floor_s=6.0,
        ),
        poll_s=0.5,
        renew_s=1.0,
        speed=SpeedProfile(step_s=0.5, jitter=0.2),
    )
    return attrs.evolve(base, **changes)


# --- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_same_seed_gives_the_same_trace_hash(seed: int) -> None:
    one, two = world.run(swarm.scenario(seed)), world.run(swarm.scenario(seed))
    assert one.trace_hash == two.trace_hash
    assert one.summary == two.summary
    assert one.actions == two.actions


def test_same_seed_same_losses_when_learners_really_train() -> None:
    s = small(training=TrainingSpec(), duration_s=20.0)
    one, two = world.run(s), world.run(s)
    assert one.trace_hash == two.trace_hash
    assert one.summary.losses == two.summary.losses


def test_another_seed_gives_another_trace() -> None:
    one = world.run(small(seed=1, duration_s=10.0))
    assert one.trace_hash != world.run(small(seed=2, duration_s=10.0)).trace_hash


# --- what it measures -------------------------------------------------------------------------


def test_a_clean_run_commits_with_everyone_and_counts_its_requests() -> None:
    s = small(
        config=attrs.evolve(small().config, quorum=3, alignment=Alignment.CARRY),
        speed=SpeedProfile(step_s=0.5),  # no jitter: nominal step cost is then exact
    )
    report = world.run(s)
    m = report.summary
    assert report.ok
    assert m.records >= 8
    assert m.participants_mean > 2.5
    assert m.staleness_max == 0
    assert 0.8 < m.settled_goodput <= 1.01  # step ends quantize the window edges
    assert m.goodput <= m.train_share <= 1.0
    assert m.requests["put"] > 0
    assert m.requests["get"] > 0
    assert m.cost_usd > 0
    assert m.takeovers == 0


def test_training_lowers_the_committed_models_loss() -> None:
    m = world.run(small(training=TrainingSpec(), duration_s=50.0)).summary
    first, last = m.losses[0][2], m.losses[-1][2]
    assert m.final_loss == last
    assert last < 0.7 * first


def test_a_crashed_closer_is_taken_over() -> None:
    crash = Fault(kind=FaultKind.CRASH, node="l00", at_s=8.0)
    report = world.run(small(faults=(crash,), duration_s=40.0))
    assert report.ok
    assert report.summary.takeovers >= 1
    assert report.summary.closers.get("l01", 0) > 0


def test_a_paused_learner_loses_goodput_and_a_poisoned_one_is_rejected() -> None:
    pause = Fault(kind=FaultKind.PAUSE, node="l02", at_s=0.0, duration_s=30.0)
    poison = Fault(kind=FaultKind.POISON, node="l01", at_s=0.0)
    clean = world.run(small()).summary
    hurt = world.run(small(faults=(pause, poison))).summary
    assert hurt.goodput < clean.goodput - 0.3
    assert hurt.rejections.get("nonfinite", 0) > 0


def test_a_flaky_throttled_lagging_store_is_survived() -> None:
    store = StoreProfile(fail_rate=0.05, lost_rate=0.05, throttle_rps=30.0, list_lag_s=1.0)
    report = world.run(small(store=store))
    assert report.ok
    assert sum(report.summary.failed_requests.values()) > 0
    assert report.summary.records > 3


def test_cut_off_learner_contributes_nothing_while_cut_off() -> None:
    cut = Fault(kind=FaultKind.CUTOFF, node="l02", at_s=0.0, duration_s=30.0)
    m = world.run(small(faults=(cut,), check=CheckPolicy.END)).summary
    assert m.failed_requests
    assert m.participants_max <= 2


def test_store_only_split_names_real_invariants() -> None:
    """A new invariant is judged after every action until someone decides otherwise."""
    assert set(invariants.STATE_INVARIANTS) >= checks.STORE_ONLY
    assert set(checks.store_part()) | set(checks.node_part()) == set(invariants.STATE_INVARIANTS)


# --- scenarios --------------------------------------------------------------------------------


def test_scenario_round_trips_through_plain_data() -> None:
    s = swarm.scenario(3)
    assert scenario.from_mapping(scenario.to_mapping(s)) == s


def test_scenario_rejects_unknown_fields_by_name() -> None:
    doc = scenario.to_mapping(Scenario())
    doc["learnerz"] = 3
    with pytest.raises(ValueError, match="learnerz"):
        scenario.from_mapping(doc)


# --- pure helpers -----------------------------------------------------------------------------

spans = st.lists(
    st.tuples(
        st.sampled_from([FaultKind.PAUSE, FaultKind.SLOW]),
        st.floats(0, 100),
        st.floats(0.01, 30),
        st.floats(1.0, 4.0),
    ),
    max_size=6,
)


def _faults(raw: list[tuple[FaultKind, float, float, float]]) -> tuple[Fault, ...]:
    return tuple(Fault(kind=k, node="l00", at_s=a, duration_s=d, factor=f) for k, a, d, f in raw)


@given(spans, st.floats(0, 150))
def test_intervals_take_the_largest_factor_covering_each_moment(
    raw: list[tuple[FaultKind, float, float, float]], t: float
) -> None:
    faults = _faults(raw)
    factor, until = speed.intervals_of(faults, "l00").at(t)
    covering = [
        (math.inf if f.kind is FaultKind.PAUSE else f.factor)
        for f in faults
        if f.at_s <= t < f.at_s + f.duration_s
    ]
    assert factor == max(covering, default=1.0)
    assert until > t


@given(spans, st.integers(1, 20), st.floats(0.1, 5.0), st.floats(0, 50))
def test_planned_steps_end_in_order_and_take_at_least_their_work(
    raw: list[tuple[FaultKind, float, float, float]], steps: int, mean_s: float, start: float
) -> None:
    slow = speed.intervals_of(_faults(raw), "l00")
    ends, work = speed.plan_steps(start, steps, mean_s, 0.0, slow, np.random.default_rng(0))
    assert np.all(np.diff(ends) > 0)
    assert ends[0] > start
    assert ends[-1] - start >= work.sum() - 1e-9
    assert np.all(work >= mean_s - 1e-9)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=12))
def test_the_ledger_never_credits_a_step_twice(pairs: list[tuple[int, int]]) -> None:
    ledger = Ledger()
    total = 0
    for a, b in pairs:
        start, end = min(a, b), max(a, b)
        total += ledger.credit(Span(learner="l", incarnation=1, fragment=0, start=start, end=end))
    covered = set()
    for a, b in pairs:
        covered |= set(range(min(a, b) + 1, max(a, b) + 1))
    assert total <= len(covered)


@given(st.lists(st.integers(1, 10), max_size=10), st.integers(0, 3))
def test_overlapping_deltas_in_order_credit_every_step_once(gaps: list[int], overlap: int) -> None:
    """A learner running ahead publishes deltas that overlap the previous one."""
    ledger, position, total = Ledger(), 0, 0
    for gap in gaps:
        start = max(0, position - overlap)
        position += gap
        total += ledger.credit(
            Span(learner="l", incarnation=1, fragment=0, start=start, end=position)
        )
    assert total == position


def test_names_are_valid_node_ids() -> None:
    assert speed.learner_names(3) == ("l00", "l01", "l02")
    assert speed.learner_names(120)[-1] == "l119"
