"""A finished run, in one process over ``memory://``: a dedicated closer's ``serve()``
returns once the last learner's ``Session.run`` has written ``finished.json``, and a node
started on the finished run is refused by name; a closer never creates a run."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, RunError, RunFinishedError, Session, SessionOptions

ALGORITHM = DiLoCo(sync_every=4, quorum=1, lease_timeout_s=2.0)
OPTIONS = SessionOptions(
    poll_s=0.02, renew_s=0.2, close_timeout_s=10.0, stall_timeout_s=30.0, join_timeout_s=30.0
)


def test_serve_returns_once_the_run_is_finished_and_late_nodes_are_refused() -> None:
    url = f"memory://finished-{uuid.uuid4().hex[:10]}/run"
    model, train = torch_model(0)
    learner = Session(model, algorithm=ALGORITHM, mailbox=url, node="a", options=OPTIONS)
    learner.start()  # creates the run
    closer = Session(algorithm=ALGORITHM, mailbox=url, node="c", role="closer", options=OPTIONS)
    closer.start()
    rng = np.random.default_rng(0)

    def step(_: int) -> int:
        x = rng.normal(size=(8, IN)).astype(np.float32)
        train(x, x @ TEACHER)
        return 8

    try:
        closer.serve(duration_s=0.5)  # not finished yet: it serves for the time given
        assert not closer.finished
        learner.run(step, range(12))
        assert learner.finished
        closer.serve()  # returns by itself: finished.json is there
        assert closer.finished
    finally:
        closer.close()
        learner.close()
    late = Session(model, algorithm=ALGORITHM, mailbox=url, node="late", options=OPTIONS)
    with pytest.raises(RunFinishedError, match=r"finished at round \d+ \(found by a\): 1 slices"):
        late.start()


def test_a_closer_with_a_model_never_creates_the_run() -> None:
    url = f"memory://nocreate-{uuid.uuid4().hex[:10]}/run"
    model, _ = torch_model(0)
    brief = SessionOptions(poll_s=0.02, join_timeout_s=0.2)
    closer = Session(model, algorithm=ALGORITHM, mailbox=url, role="closer", options=brief)
    with pytest.raises(RunError, match="no run here"):
        closer.start()
