"""Learners of different precisions in one run: the wire schema, the format rule, exact anchors.

A bf16 and an fp32 Llama (transformers, built from a small config) train one run;
a bf16 model creates runs that ship bf16 unless told otherwise; a learner whose
run ships a wider format than its parameters is warned; and a bf16 learner that
aligned with an fp32 commit and trained no step has an exactly-zero delta.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
import torch
from lm_threads import FAST, train_together
from lm_worker import build

from gm_core.records import FOLDS, Alignment, FragmentPlan, WireFormat
from gm_shell import DiLoCo, RunMismatchError, Session, align
from gm_shell.models import adapt
from gm_shell.replica import Replica
from gm_shell.session import WireWidthWarning


def fresh_url() -> str:
    return f"memory://precision-{uuid.uuid4().hex[:10]}/run"


def algorithm(**over: Any) -> DiLoCo:
    fields: dict[str, Any] = {"sync_every": 8, "fragments": 2, "quorum": 2, "in_flight": 1}
    return DiLoCo(**{"lease_timeout_s": 5.0, **fields, **over})


def llama(dtype: torch.dtype, seed: int = 0) -> Any:
    return build("llama", seed=seed).to(dtype)


@pytest.mark.parametrize("mode", FOLDS)
def test_a_bf16_learner_that_trained_no_step_has_an_exactly_zero_delta(mode: Alignment) -> None:
    model = llama(torch.bfloat16)
    adapter = adapt(model)
    names = tuple(t.name for t in adapter.schema())
    replica = Replica(adapter, FragmentPlan(fragments=(names,)))
    rng = np.random.default_rng(0)
    size = replica.fragments[0].layout.total
    committed = rng.normal(size=size).astype(np.float32)  # fp32: bf16 cannot hold most of it
    replica.overwrite_all([committed])
    assert np.count_nonzero(replica.read(0) - committed) > 0.9 * size  # the model rounded it
    assert np.count_nonzero(replica.take(0, 0, keep_copy=True).delta()) == 0
    replica.apply(0, 0, rng.normal(size=size).astype(np.float32), mode, mixing=0.5)
    if mode is Alignment.OVERWRITE:
        assert np.count_nonzero(replica.take(1, 0, keep_copy=False).delta()) == 0


def test_a_bf16_model_creates_runs_that_ship_bf16_unless_told_otherwise() -> None:
    url = fresh_url()
    with Session(llama(torch.bfloat16), algorithm=algorithm(), mailbox=url, options=FAST) as s:
        assert s.manifest is not None
        config = s.manifest.config
        assert (config.delta_format, config.commit_format) == (WireFormat.BF16, WireFormat.BF16)
        assert {t.dtype for t in s.manifest.schema} == {"F32"}  # the wire schema
        # An fp32 node that leaves the formats to the run joins it; one that insists cannot.
        with Session(llama(torch.float32), algorithm=algorithm(), mailbox=url, options=FAST):
            pass
        insists = algorithm(delta_format="F32")
        with pytest.raises(RunMismatchError, match=r"config\.delta_format: the run has"):
            Session(llama(torch.float32), algorithm=insists, mailbox=url, options=FAST).start()
    with Session(llama(torch.float32), algorithm=algorithm(), mailbox=fresh_url()) as s:
        assert s.manifest is not None
        assert s.manifest.config.delta_format is WireFormat.F32
        with pytest.warns(WireWidthWarning, match=r"delta_format=F32 and commit_format=F32.*BF16"):
            Session(llama(torch.bfloat16), algorithm=algorithm(), mailbox=s.url).start()


def test_bf16_and_fp32_learners_train_one_run() -> None:
    torch.set_num_threads(1)
    url = fresh_url()
    models = [llama(torch.float32, seed=1), llama(torch.bfloat16, seed=2)]
    sessions = [
        Session(m, algorithm=algorithm(), mailbox=url, node=f"n{i}", options=FAST)
        for i, m in enumerate(models)
    ]
    with pytest.warns(WireWidthWarning):
        losses = train_together(sessions, models, steps=64)
    for node_losses in losses:
        assert np.mean(node_losses[-8:]) < 0.5 * np.mean(node_losses[:8]), node_losses
    assert models[1].model.embed_tokens.weight.dtype == torch.bfloat16
    fresh = [llama(torch.float32, seed=3), llama(torch.bfloat16, seed=4)]
    assert align(fresh[0], mailbox=url) == align(fresh[1], mailbox=url)
    for exact, rounded in zip(*(m.parameters() for m in fresh), strict=True):
        assert torch.equal(exact.bfloat16(), rounded)  # one commit, as each precision holds it
