"""The CUDA staging buffers (:mod:`gm_shell.staging`) copy what the CPU path copies, bit for
bit. These need a CUDA device: ``bench/device_check.sh`` runs them there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gm_core.records import Alignment, FragmentPlan
from gm_shell.models import TorchModel
from gm_shell.replica import Replica

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (bench/device_check.sh)"
)


def net(dtype: torch.dtype, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.Linear(65, 7))
    return model.to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_capture_and_align_equal_the_cpu_path(dtype: torch.dtype) -> None:
    replicas = {}
    for device in ("cpu", "cuda"):
        adapter = TorchModel(net(dtype, device))
        names = tuple(t.name for t in adapter.schema())
        replicas[device] = Replica(adapter, FragmentPlan(fragments=(names,)))
    start = replicas["cpu"].read(0)
    np.testing.assert_array_equal(replicas["cuda"].read(0), start)
    committed = start + np.float32(0.25)
    for replica in replicas.values():
        replica.overwrite_all([start])
    taken = {d: r.take(0, 0, keep_copy=True).theta.copy() for d, r in replicas.items()}
    np.testing.assert_array_equal(taken["cuda"], taken["cpu"])
    for replica in replicas.values():
        replica.apply(0, 0, committed, Alignment.CARRY, 1.0)
    np.testing.assert_array_equal(replicas["cuda"].read(0), replicas["cpu"].read(0))
    assert replicas["cuda"].fragments[0]._cuda is not None  # the staging path was taken
