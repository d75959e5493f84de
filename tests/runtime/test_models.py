"""Model adapters: torch and MLX parameters as flat fp32 fragments, both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from runtime_worker import mlx_model, torch_model

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
