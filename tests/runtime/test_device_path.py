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


def test_the_side_stream_is_ordered_with_the_training_kernels() -> None:
    """No synchronization in between: a capture sees a parameter update queued behind long
    kernels on the current stream, and a kernel queued after an align sees its values."""
    import copy

    torch.manual_seed(0)
    twin = torch.nn.Linear(1024, 1024)  # 4 MiB: the transfers take a while too
    model = copy.deepcopy(twin).cuda()
    plan = FragmentPlan(fragments=(("weight", "bias"),))
    replica, reference = Replica(TorchModel(model), plan), Replica(TorchModel(twin), plan)
    start = replica.read(0)
    replica.overwrite_all([start])
    busy = torch.randn(4096, 4096, device="cuda")

    def queue_long_kernels() -> None:
        for _ in range(4):
            torch.tanh(busy @ busy, out=busy)

    with torch.no_grad():
        queue_long_kernels()
        model.weight.add_(1.0)
        twin.weight.add_(1.0)
    np.testing.assert_array_equal(replica.take(0, 0, keep_copy=False).theta, reference.read(0))
    committed = start + np.float32(0.5)
    queue_long_kernels()
    replica.apply(0, 0, committed, Alignment.OVERWRITE, 1.0)
    seen = torch.cat([model.weight.detach().flatten(), model.bias.detach()]) * 1.0
    np.testing.assert_array_equal(seen.cpu().numpy(), committed)
