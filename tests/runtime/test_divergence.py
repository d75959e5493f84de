"""A learner whose model goes non-finite: reloaded, told by name, reset by the user's hook.

Two learner-and-closer sessions train on threads over one ``memory://`` bucket;
one of them writes a NaN into its own weights once (as an exploding step would).
Its next delta is rejected as non-finite; the learner must reload every fragment
from the newest commit, emit ``Diverged``, call ``on_diverged`` on the training
thread, and then contribute again. A learner that keeps producing NaN gets
``DivergedError`` from ``step()`` instead of silently training on garbage.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from runtime_worker import IN, TEACHER, torch_model
from test_session import FAST, algorithm, flat, fresh_url

from gm_core.records import Reason
from gm_shell import DivergedError, Session, events


def poison(model: Any) -> None:
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")


def node(
    url: str, i: int, steps: int, poison_at: set[int], out: dict[str, Any], compute: str
) -> None:
    model, train_step = torch_model(seed=i)
    resets: list[int] = []
    got: list[events.Event] = []
    session = Session(
        model,
        algorithm=algorithm(),
        mailbox=url,
        node=f"n{i}",
        options=attrs.evolve(FAST, compute=compute),
        callbacks=[got.append],
        on_diverged=lambda: resets.append(session.step_count),
    )
    rng = np.random.default_rng(i)
    try:
        with session:
            for step in range(steps):
                if step in poison_at:
                    poison(model)
                x = rng.normal(size=(32, IN)).astype(np.float32)
                train_step(x, x @ TEACHER)
                session.step(samples=32)
    except DivergedError as error:
        out["error"] = error
    out.update(model=model, resets=resets, events=got)


def run(poison_at: set[int], steps: int = 160, compute: str = "auto") -> list[dict[str, Any]]:
    url = fresh_url()
    results: list[dict[str, Any]] = [{}, {}]
    threads = [
        threading.Thread(
            target=node, args=(url, i, steps, poison_at if i else set(), results[i], compute)
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(r for r in results), "a node failed (see the thread's traceback above)"
    return results


@pytest.mark.parametrize("compute", ["numpy", "torch"])
def test_one_nan_is_rejected_reloaded_reset_and_training_goes_on(compute: str) -> None:
    """On either merge path: with ``torch`` the closer decodes and judges deltas on its
    torch device (:attr:`gm_shell.fragments.FragmentCodec.device`), with ``numpy`` on the
    host; the NaN delta must be rejected ``nonfinite`` by name on both."""
    healthy, poisoned = run(poison_at={40}, compute=compute)
    rejected = [
        e for r in (healthy, poisoned) for e in r["events"] if isinstance(e, events.Rejected)
    ]
    assert Reason.NONFINITE in {e.reason for e in rejected if e.learner == "n1"}
    diverged = [e for e in poisoned["events"] if isinstance(e, events.Diverged)]
    assert [e.times for e in diverged] == [1]
    assert len(poisoned["resets"]) == 1
    assert poisoned["resets"][0] > 40, "the hook ran before the NaN was written"
    assert "error" not in poisoned
    assert np.all(np.isfinite(flat(poisoned["model"])))
    published = [e.round for e in poisoned["events"] if isinstance(e, events.Published)]
    assert max(published) > diverged[0].round, "it never published again"
    assert not [e for e in healthy["events"] if isinstance(e, events.Diverged)]


def test_a_learner_that_keeps_diverging_gets_an_error_from_step() -> None:
    _, poisoned = run(poison_at=set(range(40, 160)))
    error = poisoned.get("error")
    assert isinstance(error, DivergedError)
    assert "2 commits in a row rejected" in str(error)
