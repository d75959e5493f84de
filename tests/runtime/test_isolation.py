"""A node's machines are isolated: the closer raising stops neither the learner nor the run.

One node runs both machines (quorum 1, so its own closer must commit every round).
Once the closer has committed round 3, its ``advance`` raises once (an injected
fault: the real core, the real runtime, a real bucket). The closer must be reported
(``machine_restarted``), start again from the tape after its backoff and commit the
following rounds, while the learner trains every step without raising and aligns
with those commits.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from runtime_worker import IN, TEACHER, torch_model

from gm_core import closer
from gm_core.events import Event
from gm_shell import DiLoCo, Session, SessionOptions, events

FAST = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=10.0, stall_timeout_s=30.0, join_timeout_s=30.0
)


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
    model, train_step = torch_model(seed=0)
    seen: list[events.Event] = []
    algorithm = DiLoCo(sync_every=8, fragments=2, quorum=1, in_flight=1, lease_timeout_s=3.0)
    rng = np.random.default_rng(0)
    url = f"memory://isolation-{uuid.uuid4().hex[:10]}/run"
    with Session(
        model, algorithm=algorithm, mailbox=url, node="n0", options=FAST, callbacks=[seen.append]
    ) as session:
        for _ in range(160):
            x = rng.normal(size=(32, IN)).astype(np.float32)
            train_step(x, x @ TEACHER)
            session.step(samples=32)
        aligned = session.round
    restarted = [e for e in seen if isinstance(e, events.MachineRestarted)]
    assert len(raised) == 1
    assert [(e.machine, e.times) for e in restarted] == [("closer", 1)]
    assert "injected fault in the closer" in restarted[0].detail
    after = [e.round for e in seen if isinstance(e, events.Committed) and e.round > raised[0]]
    assert len(after) >= 4, after  # the restarted closer commits the rounds that follow
    assert aligned >= raised[0] + 4  # and the learner, which never stopped, aligned with them
