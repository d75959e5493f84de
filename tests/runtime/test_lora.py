"""A peft LoRA run ships the adapters alone; a node with another frozen base is refused by name.

Two GPT-2 nodes with LoRA adapters (r=4 on ``c_attn``, ``c_fc``) over one frozen base train
one run on threads of this process through a ``file://`` bucket. What a fragment
payload holds is read from the bucket: its tensor bytes are exactly the adapter
bytes of that fragment (safetensors adds only its header).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_threads import FAST, train_together
from lm_worker import batch, build, loss_of

import gm_shell
from gm_core import codec, keys
from gm_core.records import Manifest, RoundRecord, Snapshot
from gm_shell import DiLoCo, RunMismatchError, Session

ALGORITHM = DiLoCo(sync_every=8, fragments=2, quorum=2, in_flight=1, lease_timeout_s=5.0)


def adapter_bytes(model: torch.nn.Module) -> int:
    """The trainable parameters' bytes as fp32."""
    return sum(4 * p.numel() for p in model.parameters() if p.requires_grad)


def tensor_bytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors payload: the file less its header."""
    data = path.read_bytes()
    (header,) = struct.unpack("<Q", data[:8])
    return len(data) - 8 - header


def test_a_lora_run_ships_the_adapters_alone(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    bucket = tmp_path / "bucket"
    url = f"file://{bucket}"
    models = [build("gpt2", seed=i, lora=True, base_seed=0) for i in (1, 2)]
    sessions = [
        Session(m, algorithm=ALGORITHM, mailbox=url, node=f"n{i}", options=FAST)
        for i, m in enumerate(models)
    ]
    losses = train_together(sessions, models, steps=48, lr=2e-2)
    for node_losses in losses:
        assert np.mean(node_losses[-8:]) < 0.7 * np.mean(node_losses[:8]), node_losses

    manifest = codec.decode(Manifest, (bucket / "manifest.json").read_bytes())
    trainable = {n for n, p in models[0].named_parameters() if p.requires_grad}
    assert {t.name for t in manifest.schema} == trainable
    assert all(".lora_" in n for n in trainable)
    assert len(manifest.frozen) == sum(1 for p in models[0].parameters() if not p.requires_grad)
    numel = {n: p.numel() for n, p in models[0].named_parameters()}
    per_fragment = [4 * sum(numel[n] for n in names) for names in manifest.plan.fragments]
    assert sum(per_fragment) == adapter_bytes(models[0])
    snapshots = [
        codec.decode(Snapshot, path.read_bytes()) for path in bucket.glob("snapshots/*/*.json")
    ]
    assert snapshots, "every snapshot was swept"
    for snapshot in snapshots:
        payload = bucket / snapshot.payload.key
        assert tensor_bytes(payload) == per_fragment[snapshot.fragment], snapshot
    newest = max(bucket.glob("rounds/*.json"))
    frontier = codec.decode(RoundRecord, newest.read_bytes()).frontier
    assert [tensor_bytes(bucket / state.theta.key) for state in frontier] == per_fragment

    # The adapters load into a model with the same base, whatever its adapters were.
    evaluator = build("gpt2", seed=7, lora=True, base_seed=0)
    tokens = batch(np.random.default_rng(0))
    with torch.no_grad():
        before = float(loss_of(evaluator, tokens))
    newest_round = gm_shell.align(evaluator, mailbox=url).round
    with torch.no_grad():
        after = float(loss_of(evaluator, tokens))
    assert after < 0.7 * before, (before, after)

    # align(round=...) loads an earlier commit while its payloads are kept.
    earlier = codec.decode(RoundRecord, (bucket / keys.round_record(newest_round - 1)).read_bytes())
    checkpoint = gm_shell.align(evaluator, mailbox=url, round=newest_round - 1)
    assert checkpoint.round == newest_round - 1
    assert checkpoint.versions == tuple(f.version for f in earlier.frontier)
    with pytest.raises(gm_shell.RunError, match=f"round {newest_round + 5} has no record"):
        gm_shell.align(evaluator, mailbox=url, round=newest_round + 5)


def test_a_node_with_another_base_is_refused_by_name(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    first = build("gpt2", seed=1, lora=True, base_seed=0)
    with Session(first, algorithm=ALGORITHM, mailbox=url, node="n0", options=FAST):
        other = build("gpt2", seed=2, lora=True, base_seed=1)
        refused = r"frozen tensors that differ from the run's base \(shape or values\): .*wte"
        with pytest.raises(RunMismatchError, match=refused):
            Session(other, algorithm=ALGORITHM, mailbox=url, node="n1", options=FAST).start()
        with pytest.raises(RunMismatchError, match=refused):
            gm_shell.align(build("gpt2", seed=3, lora=True, base_seed=1), mailbox=url)
        same_base = build("gpt2", seed=2, lora=True, base_seed=0)
        with Session(same_base, algorithm=ALGORITHM, mailbox=url, node="n1", options=FAST):
            pass


def test_frozen_digests_are_of_values_not_of_the_dtype_they_are_held_in() -> None:
    model = build("gpt2", seed=1, lora=True, base_seed=0)
    held_in_bf16 = build("gpt2", seed=1, lora=True, base_seed=0)
    with torch.no_grad():  # a base whose values bf16 holds exactly, in both models
        for a, b in zip(model.parameters(), held_in_bf16.parameters(), strict=True):
            a.copy_(a.bfloat16().float())
            b.copy_(a)
    held_in_bf16.to(torch.bfloat16)
    assert gm_shell.models.adapt(model).frozen() == gm_shell.models.adapt(held_in_bf16).frozen()
    json.dumps([t.name for t in gm_shell.models.adapt(model).frozen()])  # plain names
