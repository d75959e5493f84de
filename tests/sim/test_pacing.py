"""A 40 s pause of one learner in the simulator: the estimates are back within one round.

Two learners at 0.1 s per step, a round every second; learner ``l00`` stops training
for 40 s (an eval pass or a checkpoint it did not declare). The round records the
real closer writes carry ξ_step and ξ_quorum, and the grace window follows from
them (a record's ``grace_s`` is what its round waited). With plain EMAs the same
seed gave ξ_step 2.6×, grace 2.0× and ξ_quorum 60× their values before the pause;
with winsorized samples (gm_core.timing) ξ_step and the grace window stay
within 10% from the first round after the pause on.
"""

from __future__ import annotations

import itertools
import statistics

from gm_core import codec, keys, schedule, timing
from gm_core.records import AlgorithmConfig, RoundRecord
from gm_core.sim import world
from gm_core.sim.scenario import Fault, FaultKind, Scenario, SpeedProfile

PAUSE_AT_S, PAUSE_S = 50.0, 40.0
SCENARIO = Scenario(
    name="pause",
    seed=3,
    learners=2,
    duration_s=130.0,
    config=AlgorithmConfig(sync_every=20, fragments=2, quorum=1, in_flight=2),
    poll_s=0.1,
    renew_s=2.0,
    speed=SpeedProfile(step_s=0.1, jitter=0.1),
    faults=(Fault(kind=FaultKind.PAUSE, node="l00", at_s=PAUSE_AT_S, duration_s=PAUSE_S),),
)


def records(scenario: Scenario) -> list[RoundRecord]:
    """Every round record the run wrote (records are never swept), in round order."""
    run = world._World(scenario, None)
    assert run.run().ok
    found = [
        codec.decode(RoundRecord, stored.data)
        for key, stored in run.c.store.objects.items()
        if key.startswith(keys.ROUNDS_PREFIX)
    ]
    return sorted(found, key=lambda r: r.round)


def test_a_pause_is_forgotten_within_one_round() -> None:
    tape = records(SCENARIO)
    pause_step = PAUSE_AT_S / SCENARIO.speed.step_s
    steady = [r for r in tape if pause_step / 2 <= r.step < pause_step]
    normal_step = statistics.median(r.timing.step_s or 0.0 for r in steady)
    normal_quorum = statistics.median(r.timing.quorum_s or 0.0 for r in steady)
    windows = {r.round: window(previous, r) for previous, r in itertools.pairwise(tape)}
    normal_grace = statistics.median(windows[r.round] for r in steady)
    absent = [r.round for r in tape if r.step > pause_step and not took_part("l00", r)]
    back = next(r for r in tape if r.round > absent[0] and took_part("l00", r))
    after = [r for r in tape if r.round > back.round]
    assert len(after) >= 20, "the run did not go on after the pause"
    for r in after:
        assert r.timing.step_s is not None
        assert r.timing.step_s <= 1.1 * normal_step, (r.round, r.timing, normal_step)
        assert windows[r.round] <= 1.1 * normal_grace, (r.round, windows[r.round], normal_grace)
        assert (r.timing.quorum_s or 0.0) <= 2.5 * normal_quorum, (r.round, r.timing)


def window(previous: RoundRecord, record: RoundRecord) -> float:
    """The grace window ``record``'s round was given (its ``grace_s`` is what it waited)."""
    config = SCENARIO.config
    gap = schedule.gap_of(record.round, config.sync_every, config.fragments)
    return timing.window_s(previous.timing, config, gap)


def took_part(learner: str, record: RoundRecord) -> bool:
    return learner in {p.learner for p in record.participants}
