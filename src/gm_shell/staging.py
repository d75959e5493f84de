"""Copies between a CUDA fragment's parameters and host buffers, in one transfer each way.

Theory of operation
-------------------
A fragment whose parameters live on a CUDA device is copied through two flat fp32
buffers made once per fragment (:class:`CudaStage`): one on the device, whose
per-parameter views take the parameters with one device kernel each (converting
bf16/fp16 to fp32 on the device), and one in pinned host memory. A gather is then the
device kernels, one ``non_blocking`` device-to-host transfer of the whole fragment, one
synchronization (the caller uses the values at once: they are the snapshot's), and a
host ``memcpy`` into the caller's buffer; a scatter the reverse, with no
synchronization at all: the transfer and the kernels that write the parameters are
queued on the current stream, so they are ordered before any later training kernel,
and the pinned buffer is only reused once an event says the transfer out of it ended.
Before, each parameter was copied with its own synchronous ``copy_`` (one transfer and
one wait per tensor).

The copies run on the current stream, not a side stream: the training thread calls
between two optimizer steps, and ordering with the step's kernels is what makes the
copy see them (a side stream would need the same wait). CPU parameters never come
here (:class:`gm_shell.models._TorchFragment` copies them as before); MPS parameters
still go tensor by tensor (not built: no MPS machine to measure it on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gm_core.numerics.arrays import F32
from gm_core.numerics.layout import Layout


def copy_tensors(targets: Sequence[Any], sources: Sequence[Any]) -> None:
    """``targets[i].copy_(sources[i])`` for all i: one fused op where devices and dtypes
    agree, else tensor by tensor (converting on the way)."""
    import torch

    with torch.no_grad():
        if hasattr(torch, "_foreach_copy_") and all(
            t.device == s.device and t.dtype == s.dtype
            for t, s in zip(targets, sources, strict=True)
        ):
            torch._foreach_copy_(list(targets), list(sources))
        else:
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source)


def cuda_device(params: Sequence[Any]) -> Any | None:
    """The CUDA device every parameter of ``params`` is on, or None."""
    devices = {p.device for p in params}
    if len(devices) != 1:
        return None
    device = devices.pop()
    return device if device.type == "cuda" else None


class CudaStage:
    """A flat fp32 device buffer and a flat pinned host buffer for one fragment."""

    def __init__(self, layout: Layout, device: Any) -> None:
        import torch

        self.device = device
        self._flat = torch.empty(layout.total, dtype=torch.float32, device=device)
        self._views = [self._flat[s.start : s.stop].view(s.shape) for s in layout.spans]
        self._host = torch.empty(layout.total, dtype=torch.float32, pin_memory=True)
        self._host_values: F32 = self._host.numpy()
        self._uploaded: Any = None
        """An event recorded after the last transfer out of the pinned buffer."""

    def _host_free(self) -> None:
        if self._uploaded is not None:
            self._uploaded.synchronize()
            self._uploaded = None

    def gather(self, params: Sequence[Any], out: F32) -> None:
        import torch

        copy_tensors(self._views, params)
        self._host_free()
        with torch.no_grad():
            self._host.copy_(self._flat, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        np.copyto(out, self._host_values)

    def scatter(self, params: Sequence[Any], flat: F32) -> None:
        import torch

        self._host_free()
        np.copyto(self._host_values, flat)
        with torch.no_grad():
            self._flat.copy_(self._host, non_blocking=True)
        copy_tensors(params, self._views)
        self._uploaded = torch.cuda.current_stream(self.device).record_event()
