"""Copies between a CUDA fragment's parameters and host buffers, in one transfer each way.

Theory of operation
-------------------
A fragment whose parameters live on a CUDA device is copied through two flat fp32
buffers made once per fragment (:class:`CudaStage`): one on the device, whose
per-parameter views take the parameters with one device kernel each (converting
bf16/fp16 to fp32 on the device), and one in pinned host memory. The transfers between
the two run on a side stream of the stage's own, ordered with the current (training)
stream by events on the device, and the host waits only where it uses the data:

* gather (a capture): the kernels that read the parameters into the device buffer run
  on the current stream, after the optimizer step that wrote them; the side stream
  waits for those (an event, on the device) and moves the whole fragment to the pinned
  buffer (``non_blocking``); the host waits for that transfer alone (the values are the
  snapshot's, read at once) and copies them into the caller's buffer;
* scatter (an align): the host copies the values into the pinned buffer (once the
  previous transfer out of it has ended), the side stream moves them to the device
  buffer, after only the kernels that last read it (the previous scatter's), not after
  the training kernels still queued; the current stream waits for that transfer (an
  event, on the device) before the kernels that write the parameters: the host never
  waits, and the next training kernels are ordered after the write.

Before, each parameter was copied with its own synchronous ``copy_`` on the current
stream (one transfer and one wait per tensor). CPU parameters never come here
(:class:`gm_shell.models._TorchFragment` copies them as before); MPS parameters still go
tensor by tensor (not staged: no Mac here to measure whether Apple's shared memory gains).
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
    """A flat fp32 device buffer, a flat pinned host buffer and a side stream for one
    fragment."""

    def __init__(self, layout: Layout, device: Any) -> None:
        import torch

        self.device = device
        self._flat = torch.empty(layout.total, dtype=torch.float32, device=device)
        self._views = [self._flat[s.start : s.stop].view(s.shape) for s in layout.spans]
        self._host = torch.empty(layout.total, dtype=torch.float32, pin_memory=True)
        self._host_values: F32 = self._host.numpy()
        self._side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._uploaded: Any = None
        """An event recorded after the last transfer out of the pinned buffer."""
        self._read: Any = None
        """An event recorded after the last kernels that read the device buffer (a
        scatter's writes of the parameters, on the current stream)."""

    def gather(self, params: Sequence[Any], out: F32) -> None:
        import torch

        current = torch.cuda.current_stream(self.device)
        copy_tensors(self._views, params)  # after the kernels that wrote the parameters
        filled = current.record_event()
        with torch.no_grad(), torch.cuda.stream(self._side):
            self._side.wait_event(filled)
            # After any earlier transfer on this stream: none still reads the pinned buffer.
            self._host.copy_(self._flat, non_blocking=True)
            done = self._side.record_event()
        done.synchronize()  # the values are the snapshot's: used at once
        np.copyto(out, self._host_values)

    def scatter(self, params: Sequence[Any], flat: F32) -> None:
        import torch

        if self._uploaded is not None:
            self._uploaded.synchronize()  # the pinned buffer is free
        np.copyto(self._host_values, flat)
        with torch.no_grad(), torch.cuda.stream(self._side):
            if self._read is not None:
                self._side.wait_event(self._read)
            self._flat.copy_(self._host, non_blocking=True)
            self._uploaded = self._side.record_event()
        current = torch.cuda.current_stream(self.device)
        current.wait_event(self._uploaded)
        copy_tensors(params, self._views)
        self._read = current.record_event()
