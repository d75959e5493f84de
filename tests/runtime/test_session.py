"""Session in one process: several nodes on threads over a shared ``memory://`` bucket.

The multi-process tests prove survival; these pin down the user-facing contract:
training converges and every node ends on the same committed model, ``align()``
loads it, each alignment mode and wire format runs, a node whose config or model
differs is refused by name, and a run that cannot progress raises a clear
``StalledError`` instead of hanging.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import (
    DiLoCo,
    RunError,
    RunMismatchError,
    Session,
    SessionOptions,
    StalledError,
    align,
    events,
)
from gm_shell.models import adapt
from gm_shell.replica import Replica

FAST = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=10.0, stall_timeout_s=30.0, join_timeout_s=30.0
)


def fresh_url() -> str:
    return f"memory://session-{uuid.uuid4().hex[:10]}/run"


def algorithm(**over: Any) -> DiLoCo:
    fields: dict[str, Any] = {
        "sync_every": 8,
        "fragments": 2,
        "quorum": 2,
        "in_flight": 1,
        "lease_timeout_s": 3.0,
        "takeover_floor_s": 4.0,
    }
    return DiLoCo(**{**fields, **over})


def train(session: Session, train_step: Any, steps: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        x = rng.normal(size=(32, IN)).astype(np.float32)
        losses.append(train_step(x, x @ TEACHER))
        session.step(samples=32)
    return losses


def run_nodes(url: str, algo: DiLoCo, steps: int, nodes: int = 2) -> list[dict[str, Any]]:
    """``nodes`` learner-and-closer sessions training on threads; what each ended with."""
    results: list[dict[str, Any]] = [{} for _ in range(nodes)]
    barrier = threading.Barrier(nodes)

    def node(i: int) -> None:
        model, step = torch_model(seed=i)
        got: list[events.Event] = []
        session = Session(
            model, algorithm=algo, mailbox=url, node=f"n{i}", options=FAST, callbacks=[got.append]
        )
        with session:
            losses = train(session, step, steps, seed=i)
            barrier.wait(timeout=60)  # nobody closes while the others still need a closer
        results[i] = {
            "model": model,
            "losses": losses,
            "checkpoint": session.checkpoint,
            "events": got,
            "stats": session.stats,
        }

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(r for r in results), "a node failed (see the thread's traceback above)"
    return results


def flat(model: Any) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


def test_two_nodes_converge_and_end_on_the_same_commit_that_align_loads() -> None:
    url = fresh_url()
    results = run_nodes(url, algorithm(), steps=160)
    for r in results:
        assert np.mean(r["losses"][-10:]) < 0.2 * np.mean(r["losses"][:10])
    a, b = (r["checkpoint"] for r in results)
    assert a is not None
    assert b is not None
    assert a.round >= 10
    if a.round == b.round:
        np.testing.assert_array_equal(flat(results[0]["model"]), flat(results[1]["model"]))
    evaluator, _ = torch_model(seed=42)
    loaded = align(evaluator, mailbox=url)
    assert loaded.round == max(a.round, b.round)
    newest = results[0] if a.round >= b.round else results[1]
    np.testing.assert_array_equal(flat(evaluator), flat(newest["model"]))
    kinds = {type(e) for r in results for e in r["events"]}
    assert {events.Joined, events.Published, events.Committed, events.Aligned} <= kinds
    assert results[0]["stats"].put_requests > 0


@pytest.mark.parametrize(
    "over",
    [
        {"alignment": "blend", "mixing": 0.5},
        {"alignment": "carry"},
        {"delta_format": "BF16", "commit_format": "BF16", "compression": "zstd"},
        {"delta_format": "F4_E2M1", "merge": "rda", "in_flight": 2},
        {"overlap_steps": 2, "in_flight": 2},
    ],
    ids=["blend", "carry", "bf16-zstd", "f4-rda", "overlap"],
)
def test_alignment_modes_wire_formats_and_overlap_train(over: dict[str, Any]) -> None:
    results = run_nodes(fresh_url(), algorithm(**over), steps=120)
    for r in results:
        assert np.all(np.isfinite(flat(r["model"])))
        assert np.mean(r["losses"][-10:]) < 0.5 * np.mean(r["losses"][:10])


def test_adaptive_alignment_overwrites_where_learners_disagree() -> None:
    """Both thresholds at 1: no two learners' deltas are parallel, so every fragment turns to
    overwrite at its first commit of both (quorum 2) and says so; training goes on."""
    algo = algorithm(alignment="adaptive", carry_above=1.0, overwrite_below=1.0)
    results = run_nodes(fresh_url(), algo, steps=80)
    for r in results:
        changed = [e for e in r["events"] if isinstance(e, events.AlignmentChanged)]
        assert {(e.fragment, e.mode) for e in changed} == {(0, "overwrite"), (1, "overwrite")}
        assert len(changed) == 2  # once per fragment: no commit's cosine reaches 1
        assert np.mean(r["losses"][-10:]) < 0.5 * np.mean(r["losses"][:10])


def test_a_node_with_another_config_or_model_is_refused_by_name() -> None:
    url = fresh_url()
    model, _ = torch_model(0)
    with Session(model, algorithm=algorithm(quorum=1), mailbox=url, node="n0", options=FAST):
        with pytest.raises(RunMismatchError, match=r"config\.sync_every: the run has 8, .* has 9"):
            Session(model, algorithm=algorithm(quorum=1, sync_every=9), mailbox=url).start()
        other = torch.nn.Sequential(torch.nn.Linear(IN, 3))
        with pytest.raises(RunMismatchError, match=r"tensors this node lacks: fc1\.weight"):
            Session(other, algorithm=algorithm(quorum=1), mailbox=url).start()
        with pytest.raises(RunMismatchError, match="the model differs"):
            align(other, mailbox=url)


def test_a_grace_window_that_outlasts_the_stall_timeout_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fixed window at or above ``stall_timeout_s`` (30 s here): each learner is told at
    start, by name, what it risks (``gm_core.advice.advise_node``); below it, nothing."""
    model, _ = torch_model(0)
    for grace_s, warned in ((30.0, True), (29.0, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gm"):
            algo = algorithm(quorum=1, grace_seconds=grace_s)
            with Session(model, algorithm=algo, mailbox=fresh_url(), node="n0", options=FAST):
                pass
        said = [r.getMessage() for r in caplog.records if "grace_seconds" in r.getMessage()]
        assert bool(said) is warned, said
        if warned:
            assert said[0].startswith("n0: grace_seconds=30 stall_timeout_s=30:")
            assert "StalledError" in said[0]


def test_a_run_counts_samples_or_tokens_and_step_names_the_one_it_needs() -> None:
    model, _ = torch_model(0)
    url = fresh_url()
    with Session(
        model, algorithm=algorithm(quorum=1, unit="tokens"), mailbox=url, options=FAST
    ) as s:
        with pytest.raises(ValueError, match=r"counts tokens .*step\(tokens=\.\.\.\)"):
            s.step(samples=32)
        s.step(samples=32, tokens=32 * 64)
        assert s.step_count == 1
        with pytest.raises(
            RunMismatchError, match=r"config\.unit: the run has 'tokens', this node has 'samples'"
        ):
            Session(model, algorithm=algorithm(quorum=1), mailbox=url).start()
    with Session(model, algorithm=algorithm(quorum=1), mailbox=fresh_url(), options=FAST) as s:
        with pytest.raises(ValueError, match=r"counts samples: pass step\(samples=\.\.\.\)"):
            s.step(tokens=32 * 64)
        s.step()  # one sample
        assert s.step_count == 1


def test_without_a_run_or_a_closer_the_errors_say_what_is_missing() -> None:
    # A closer never creates the run: it waits (join_timeout_s) for a learner to.
    brief = SessionOptions(poll_s=0.02, join_timeout_s=0.2)
    with pytest.raises(RunError, match="no run here"):
        Session(role="closer", algorithm=algorithm(), mailbox=fresh_url(), options=brief).start()
    with pytest.raises(ValueError, match="trains a model"):
        Session(algorithm=algorithm(), mailbox=fresh_url())
    model, step = torch_model(0)
    stuck = SessionOptions(poll_s=0.02, stall_timeout_s=1.0, close_timeout_s=1.0)
    session = Session(
        model, algorithm=algorithm(quorum=1), mailbox=fresh_url(), role="learner", options=stuck
    )
    with session, pytest.raises(StalledError, match="is a closer running"):
        train(session, step, 100, seed=0)  # nobody commits: in_flight=1 stalls it
    with pytest.raises(RuntimeError, match="started session"):
        session.step()


def test_batch_size_is_this_nodes_share_and_closing_leaves_the_newest_commit() -> None:
    url = fresh_url()
    results = run_nodes(url, algorithm(global_batch_size=64), steps=80)
    evaluator, _ = torch_model(seed=3)
    loaded = align(evaluator, mailbox=url)
    newest = [r for r in results if r["checkpoint"].round == loaded.round]
    assert newest, [r["checkpoint"] for r in results]
    np.testing.assert_array_equal(flat(evaluator), flat(newest[0]["model"]))
    model, _ = torch_model(0)
    session = Session(
        model, algorithm=algorithm(global_batch_size=64), mailbox=url, node="n9", options=FAST
    )
    assert session.batch_size == 64  # before it has seen any round: alone
    session.start()
    try:
        np.testing.assert_array_equal(flat(model), flat(evaluator))  # joined at the newest
        state = Replica(adapt(model), session.manifest.plan)  # type: ignore[union-attr]
        assert len(state.fragments) == 2
    finally:
        session.close()
