"""A node's machines are isolated: one raising stops neither the other nor the run.

One node runs both machines (quorum 1, so its own closer must commit every round and
its own learner must publish for it). Once round 3 is behind them, one machine's
``advance`` raises once (an injected fault: the real core, the real runtime, a real
bucket). It must be reported (``machine_restarted``) and start again from the tape
after its backoff, while the other goes on: the training loop makes every step
without raising, and rounds keep being committed and aligned with.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from runtime_worker import IN, TEACHER, torch_model

from gm_core import closer, learner
from gm_core.events import Event, Shared, TimerFired
from gm_shell import DiLoCo, Session, SessionOptions, events

FAST = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=10.0, stall_timeout_s=30.0, join_timeout_s=30.0
)


def run(url: str, steps: int = 160) -> tuple[list[events.Event], int]:
    """Train one learner-and-closer node for ``steps``; its events and newest aligned round."""
    model, train_step = torch_model(seed=0)
    seen: list[events.Event] = []
    algorithm = DiLoCo(sync_every=8, fragments=2, quorum=1, in_flight=1, lease_timeout_s=3.0)
    rng = np.random.default_rng(0)
    with Session(
        model, algorithm=algorithm, mailbox=url, node="n0", options=FAST, callbacks=[seen.append]
    ) as session:
        for _ in range(steps):
            x = rng.normal(size=(32, IN)).astype(np.float32)
            train_step(x, x @ TEACHER)
            session.step(samples=32)
        return seen, session.round


def fresh_url() -> str:
    return f"memory://isolation-{uuid.uuid4().hex[:10]}/run"


def test_a_closer_that_raises_restarts_from_the_tape_and_the_learner_trains_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = closer.advance
    raised: list[int] = []

    def advance(state: closer.CloserState, event: Event) -> Any:
        if not raised and state.last is not None and state.last.round >= 3:
            raised.append(state.last.round)
            raise RuntimeError("injected fault in the closer")
        return real(state, event)

    monkeypatch.setattr(closer, "advance", advance)
    seen, aligned = run(fresh_url())
    restarted = [e for e in seen if isinstance(e, events.MachineRestarted)]
    assert len(raised) == 1
    assert [(e.machine, e.times) for e in restarted] == [("closer", 1)]
    assert "injected fault in the closer" in restarted[0].detail
    after = [e.round for e in seen if isinstance(e, events.Committed) and e.round > raised[0]]
    assert len(after) >= 4, after  # the restarted closer commits the rounds that follow
    assert aligned >= raised[0] + 4  # and the learner, which never stopped, aligned with them


def test_a_learner_that_raises_rejoins_from_the_tape_and_the_closer_commits_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = learner.advance
    raised: list[int] = []

    faulty: list[Event] = []

    def advance(state: learner.LearnerState, event: Event) -> Any:
        # A timer or a word from the node's closer, never a step: the runtime's forecasts
        # feed advance steps of their own. A node alone hears of each record from its
        # closer (Shared) and may never wait for a timer. That event raises each time it
        # is fed, as a pure ``advance`` would (the runtime may compute a feed twice: see
        # Runtime._feed).
        fed_by_loop = isinstance(event, (TimerFired, Shared))
        if fed_by_loop and any(event is e for e in faulty):
            raise RuntimeError("injected fault in the learner")
        if not raised and fed_by_loop and state.aligned_round >= 3:
            raised.append(state.aligned_round)
            faulty.append(event)
            raise RuntimeError("injected fault in the learner")
        return real(state, event)

    monkeypatch.setattr(learner, "advance", advance)
    seen, aligned = run(fresh_url())
    restarted = [e for e in seen if isinstance(e, events.MachineRestarted)]
    assert len(raised) == 1
    assert [(e.machine, e.times) for e in restarted] == [("learner", 1)]
    assert "injected fault in the learner" in restarted[0].detail
    joins = [e for e in seen if isinstance(e, events.Joined)]
    assert len(joins) == 2  # at the start, and again from the tape after the restart
    after = [e.round for e in seen if isinstance(e, events.Committed) and e.round > raised[0]]
    assert len(after) >= 4, after  # the closer, which never stopped, commits its snapshots
    assert aligned >= raised[0] + 4
