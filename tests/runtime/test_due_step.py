"""The due step without a round trip: what it hands over is still exactly that step's.

``Session.step()`` at a due step copies the fragment the loop planned for it and
returns without waiting for the loop (:mod:`gm_shell.pacer`). These tests train a
real torch model and go straight on with the next optimizer step after every
``step()``, then read each published delta back from the bucket and compare it
with ``anchor − θ`` as the parameters were at that round's due step. They also
pin down the pieces the due step is made of: the direct copy of CPU fp32
parameters (following a parameter whose storage was replaced) and the loop's
forwarding of posts.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from runtime_worker import IN, TEACHER, torch_model

from gm_core import codec, keys, schedule
from gm_core.records import Snapshot
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.models import adapt
from gm_shell.replica import Replica

OPTIONS = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=0.2, stall_timeout_s=30.0, join_timeout_s=30.0
)
STEPS = 48


def train_and_record(
    alignment: str, pause_s: float
) -> tuple[Mailbox, Any, list[np.ndarray], dict[int, list[np.ndarray]]]:
    """A lone learner (no closer: every anchor stays the run's initial value) trains
    ``STEPS`` steps; θ of every fragment as ``step()`` found it, by step."""
    mailbox = Mailbox.open(f"memory://due-{uuid.uuid4().hex[:10]}/run")
    model, train_step = torch_model(seed=3)
    algorithm = DiLoCo(
        sync_every=6,
        fragments=3,
        in_flight=STEPS,
        alignment=alignment,
        flush_on_close=False,
    )
    rng = np.random.default_rng(7)
    seen: dict[int, list[np.ndarray]] = {}
    with Session(
        model, algorithm=algorithm, mailbox=mailbox, node="solo", role="learner", options=OPTIONS
    ) as session:
        assert session.manifest is not None
        manifest = session.manifest
        replica = Replica(adapt(model), manifest.plan)
        count = len(manifest.plan.fragments)
        initial = [replica.read(f) for f in range(count)]
        for step in range(1, STEPS + 1):
            x = rng.normal(size=(16, IN)).astype(np.float32)
            train_step(x, x @ TEACHER)
            seen[step] = [replica.read(f) for f in range(count)]
            session.step(samples=16)  # and the next optimizer step follows at once
            if pause_s:
                time.sleep(pause_s)
    return mailbox, manifest, initial, seen


@pytest.mark.parametrize("pause_s", [0.0, 0.005], ids=["straight-on", "paced"])
@pytest.mark.parametrize("alignment", ["overwrite", "carry"])
def test_each_delta_is_the_parameters_at_its_due_step_though_training_goes_straight_on(
    alignment: str, pause_s: float
) -> None:
    mailbox, manifest, initial, seen = train_and_record(alignment, pause_s)
    cfg = manifest.config
    fragments = FragmentCodec(manifest)
    loop = LoopThread("due-step-test")
    try:
        rounds = [
            r for r in range(STEPS) if schedule.step_of(r, cfg.sync_every, cfg.fragments) <= STEPS
        ]
        for round_ in rounds:
            due = schedule.step_of(round_, cfg.sync_every, cfg.fragments)
            fragment = schedule.fragment_of(round_, cfg.fragments)
            got = loop.run(mailbox.get(keys.snapshot(round_, "solo")))
            assert got is not None, f"round {round_} (due at step {due}) was never published"
            snapshot = codec.decode(Snapshot, got.data)
            assert (snapshot.fragment, snapshot.steps) == (fragment, due)
            payload = loop.run(mailbox.get(snapshot.payload.key))
            assert payload is not None
            delta = fragments.load(fragment, Role.DELTA, snapshot.payload, payload.data)
            np.testing.assert_array_equal(
                delta,
                initial[fragment] - seen[due][fragment],
                err_msg=f"round {round_}: not the parameters of its due step {due}",
            )
            later = seen[min(due + 1, STEPS)][fragment]
            assert due == STEPS or not np.array_equal(delta, initial[fragment] - later)
    finally:
        loop.stop()
        mailbox.close()


def test_the_direct_copy_follows_a_parameter_whose_storage_was_replaced() -> None:
    model = torch.nn.Linear(3, 2)
    access = adapt(model).fragment(["weight", "bias"])
    out = np.empty(8, np.float32)
    access.gather(out)
    np.testing.assert_array_equal(out[:6], model.weight.detach().numpy().ravel())
    with torch.no_grad():
        model.weight.data = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        model.bias.data = torch.tensor([7.0, 8.0]).expand(2).clone()
    access.gather(out)
    np.testing.assert_array_equal(out, np.arange(9, dtype=np.float32)[[0, 1, 2, 3, 4, 5, 7, 8]])
    access.scatter(-out)
    np.testing.assert_array_equal(model.weight.detach().numpy().ravel(), -np.arange(6))
    # A parameter that is no longer contiguous goes through torch's own copy.
    with torch.no_grad():
        model.weight.data = torch.zeros(3, 2).t()
    access.scatter(np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(model.weight.detach().numpy(), [[0, 1, 2], [3, 4, 5]])
    assert not model.weight.is_contiguous()


def test_posts_reach_the_loop_in_order_and_stop_ends_the_forwarder() -> None:
    loop = LoopThread("post-test")
    seen: list[int] = []
    done = threading.Event()
    for i in range(200):
        loop.post(lambda i=i: seen.append(i))  # type: ignore[misc]
    loop.post(done.set)
    assert done.wait(10)
    assert seen == list(range(200))
    before = {t.name for t in threading.enumerate()}
    assert {"post-test", "post-test-post"} <= before
    loop.stop()
    assert not {"post-test", "post-test-post"} & {t.name for t in threading.enumerate()}
