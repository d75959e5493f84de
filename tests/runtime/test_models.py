"""Model adapters: torch and MLX parameters as flat fp32 fragments, both ways."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from runtime_worker import IN, TEACHER, mlx_model, torch_model

from gm_core.records import TensorSpec
from gm_shell import models
from gm_shell.models import ModelError, adapt


def roundtrip(model: Any, names: list[str]) -> None:
    """gather(scatter(x)) == x, and scatter really changes what the model computes with."""
    access = adapt(model).fragment(names)
    n = access.layout.total
    before = np.empty(n, np.float32)
    access.gather(before)
    x = np.arange(n, dtype=np.float32) / 7.0
    access.scatter(x)
    after = np.empty(n, np.float32)
    access.gather(after)
    np.testing.assert_array_equal(after, x)
    assert not np.array_equal(before, after)


def test_torch_and_mlx_twins_have_one_schema() -> None:
    torch_schema = adapt(torch_model(0)[0]).schema()
    assert adapt(mlx_model(0)[0]).schema() == torch_schema
    assert torch_schema[0] == TensorSpec(name="fc1.weight", shape=(16, 8), dtype="F32")


@pytest.mark.parametrize("staging", [True, False], ids=["staged", "in-place"])
@pytest.mark.parametrize("make", [torch_model, mlx_model], ids=["torch", "mlx"])
def test_gather_scatter_round_trip_in_any_order(
    make: Any, staging: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not staging:  # fragments above the staging size are viewed in place
        monkeypatch.setattr(models, "STAGING_BYTES", 0)
    model = make(0)[0]
    roundtrip(model, ["fc2.bias", "fc1.weight"])
    roundtrip(model, [t.name for t in adapt(model).schema()])


def test_torch_bf16_parameters_are_fp32_on_the_host_and_rounded_back() -> None:
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    adapter = adapt(model)
    assert {t.dtype for t in adapter.held()} == {"BF16"}
    assert {t.dtype for t in adapter.schema()} == {"F32"}  # the wire schema
    access = adapter.fragment(["weight"])
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    access.scatter(x)
    back = np.empty(12, np.float32)
    access.gather(back)
    np.testing.assert_array_equal(back, torch.from_numpy(x).bfloat16().float().numpy())


def test_mlx_bf16_parameters_round_trip_through_fp32() -> None:
    import mlx.core as mx
    import mlx.nn as nn

    model = nn.Linear(4, 3)
    model.set_dtype(mx.bfloat16)
    adapter = adapt(model)
    assert {t.dtype for t in adapter.held()} == {"BF16"}
    access = adapter.fragment(["weight"])
    access.scatter(np.full(12, 0.5, np.float32))
    assert model.weight.dtype == mx.bfloat16
    back = np.empty(12, np.float32)
    access.gather(back)
    np.testing.assert_array_equal(back, np.full(12, 0.5, np.float32))


def test_what_gm_cannot_train_is_refused_by_name() -> None:
    with pytest.raises(ModelError, match="neither a torch"):
        adapt(object())
    model = torch.nn.Module()
    model.count = torch.nn.Parameter(torch.zeros(3, dtype=torch.int32), requires_grad=False)
    with pytest.raises(ModelError, match="no parameter is trainable"):
        adapt(model)
    with pytest.raises(ModelError, match=r"'count' has dtype torch\.int32"):
        adapt(model, "count")
    with pytest.raises(ModelError, match="no parameters named"):
        adapt(torch.nn.Linear(2, 2)).fragment(["nope"])


def test_wrapped_torch_models_have_the_plain_models_schema(tmp_path: Path) -> None:
    """DDP (gloo, CPU, one rank), torch.compile and a compiled submodule: canonical names."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    plain = torch_model(0)[0]
    expected = adapt(plain).schema()
    compiled = torch.compile(plain, backend="eager")
    assert next(iter(dict(compiled.named_parameters()))).startswith("_orig_mod.")
    assert adapt(compiled).schema() == expected
    inner = torch_model(0)[0]
    inner.fc1 = torch.compile(inner.fc1, backend="eager")  # type: ignore[assignment]
    assert "fc1._orig_mod.weight" in dict(inner.named_parameters())
    assert adapt(inner).schema() == expected
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(torch.compile(torch_model(0)[0], backend="eager"))
        assert adapt(ddp).schema() == expected
        access = adapt(ddp).fragment(["fc1.weight"])
        access.scatter(np.zeros(access.layout.total, np.float32))
        assert float(ddp.module._orig_mod.fc1.weight.detach().abs().sum()) == 0.0
    finally:
        dist.destroy_process_group()


def test_fsdp_checkpointed_and_accelerate_models_have_the_plain_models_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real wrappers on CPU in a one-rank gloo group: FSDP (``use_orig_params``) around
    activation-checkpointed layers, FSDP2's ``fully_shard`` (DTensor parameters) and
    accelerate's ``prepare`` (DDP) have the plain model's schema; gm reads and writes them
    after a training step as the plain model; FSDP's flat parameter is refused by name."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    plain, train_plain = torch_model(0)
    expected = adapt(plain).schema()
    names = [t.name for t in expected]
    x = np.random.default_rng(0).normal(size=(16, IN)).astype(np.float32)
    train_plain(x, x @ TEACHER)
    trained = np.empty(adapt(plain).fragment(names).layout.total, np.float32)
    adapt(plain).fragment(names).gather(trained)

    def same_as_plain(wrapped: torch.nn.Module, inner: torch.nn.Module) -> None:
        """The plain model's training step on the same batch, then gather, scatter, gather."""
        assert adapt(wrapped).schema() == expected
        loss = ((wrapped(torch.from_numpy(x)) - torch.from_numpy(x @ TEACHER)) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in wrapped.parameters():
                p -= 0.05 * p.grad
        access = adapt(wrapped).fragment(names)
        got = np.empty(access.layout.total, np.float32)
        access.gather(got)
        np.testing.assert_allclose(got, trained, rtol=1e-5, atol=1e-6)
        access.scatter(np.zeros_like(got))
        access.gather(got)
        assert not got.any()
        held = [p.to_local() if hasattr(p, "to_local") else p for p in inner.parameters()]
        assert all(not p.detach().abs().sum() for p in held)  # the module's own tensors

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        checkpointed = torch_model(0)[0]
        apply_activation_checkpointing(
            checkpointed, check_fn=lambda m: isinstance(m, torch.nn.Linear)
        )
        fsdp = FullyShardedDataParallel(
            checkpointed, use_orig_params=True, device_id=torch.device("cpu")
        )
        wrapped_names = list(dict(fsdp.named_parameters()))
        assert all(n.startswith("_fsdp_wrapped_module.") for n in wrapped_names)
        assert any("._checkpoint_wrapped_module." in n for n in wrapped_names)
        same_as_plain(fsdp, fsdp)

        dtensors = torch_model(0)[0]
        fully_shard(dtensors)
        assert type(next(dtensors.parameters())).__name__ == "DTensor"
        same_as_plain(dtensors, dtensors)

        flat = FullyShardedDataParallel(torch_model(0)[0], device_id=torch.device("cpu"))
        with pytest.raises(ModelError, match=r"flat parameter.*use_orig_params=True"):
            adapt(flat)
    finally:
        dist.destroy_process_group()

    import accelerate

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    monkeypatch.setenv("MASTER_PORT", str(port.getsockname()[1]))
    port.close()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # else set
    # A Trainer made earlier in this process (tests/integrations) leaves accelerate's
    # process-wide state non-distributed; start from none, as a fresh script does.
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    try:
        prepared = accelerate.Accelerator(cpu=True).prepare(torch_model(0)[0])
        assert isinstance(prepared, torch.nn.parallel.DistributedDataParallel)
        same_as_plain(prepared, prepared)
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_models_sharded_over_ranks_are_refused_by_name(tmp_path: Path) -> None:
    """Two real gloo ranks on CPU: FSDP's FULL_SHARD and FSDP2's fully_shard leave each rank
    slices of the parameters (shapes unlike the model's); adapt refuses both, naming why."""
    script = Path(__file__).parent / "sharded_rank.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), "2", str(tmp_path)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for rank in range(2)
    ]
    outputs = [
        json.loads(r.communicate(timeout=120)[0].decode().strip().splitlines()[-1]) for r in ranks
    ]
    assert [r.returncode for r in ranks] == [0, 0]
    for out in outputs:
        plain, fsdp, dtensor = out["plain"], out["fsdp"], out["fully_shard"]
        assert sorted(fsdp["held"].values()) != sorted(plain.values())  # the premise: slices
        assert "error" in fsdp, fsdp
        assert "FSDP shards this model over 2 ranks (FULL_SHARD)" in fsdp["error"]
        assert dtensor["held"] == plain  # DTensors show the whole shapes,
        assert dtensor["local"] != plain  # and each rank holds half of them
        assert "error" in dtensor, dtensor
        assert "error" in dtensor, dtensor
        assert "is sharded: this process holds" in dtensor["error"]


MLX_LEARNER = """
import sys
import mlx.nn as nn
from gm_shell import DiLoCo, Session, SessionOptions
options = SessionOptions(poll_s=0.05, renew_s=0.5)
algorithm = DiLoCo(sync_every=4, fragments=1, quorum=1)
with Session(nn.Linear(4, 2), algorithm=algorithm, mailbox=sys.argv[1], node="m",
             options=options, run_key=None) as session:
    for _ in range(12):
        session.step(samples=1)
print(session.checkpoint.round, "torch" in sys.modules)
"""


def test_an_mlx_learner_closes_its_rounds_without_importing_torch(tmp_path: Path) -> None:
    """``compute="auto"`` merges with numpy where the model is not torch's: the MLX node
    closes rounds (role both) and its process never imports torch."""
    url = f"file://{tmp_path / 'bucket'}"
    done = subprocess.run(
        [sys.executable, "-c", MLX_LEARNER, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last_round, imported_torch = done.stdout.split()
    assert int(last_round) >= 1
    assert imported_torch == "False"
