"""The heterogeneity study: half the learners 18% slower, three closing policies."""

from __future__ import annotations

import pytest

from gm_core.sim import experiments


@pytest.mark.slow
def test_grace_window_keeps_stragglers_and_the_loss_low() -> None:
    grace, hurry, everyone = experiments.heterogeneity(learners=8, duration_s=600.0)
    assert all(arm.ok for arm in (grace, hurry, everyone))
    assert grace.goodput > everyone.goodput > hurry.goodput
    assert grace.participants > hurry.participants
    assert grace.final_loss is not None
    assert hurry.final_loss is not None
    assert grace.final_loss < hurry.final_loss


def test_arms_differ_only_in_their_closing_policy() -> None:
    base = experiments.heterogeneous_fleet(learners=4)
    assert base.speed.slow_share == 0.5
    assert base.speed.slow_factor == pytest.approx(1.18)
    assert base.speed.jitter == pytest.approx(0.10)
    assert [q for _, q, _ in experiments.arms(4)] == [1, 1, 4]
    assert [g for _, _, g in experiments.arms(4)] == [0.5, 0.0, 0.5]
