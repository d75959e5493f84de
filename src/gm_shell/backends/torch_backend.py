"""The torch backend: gm's numerics on flat fp32 torch tensors (CPU, CUDA or MPS).

Theory of operation
-------------------
Same algorithm and element order as the numpy reference, expressed with torch's
in-place kernels so nothing full-size is allocated per call:

* merges and outer steps walk the fragment in cache-sized blocks; a block's
  merged delta is accumulated with ``mul(out=)`` and ``add_(alpha=)`` in a
  scratch that stays in cache, and is consumed there by the Nesterov update;
* codecs use torch's own fp16/bf16/fp8-E4M3 conversions (round to nearest even,
  as the reference) and, for E2M1, the reference's bit-level rounding written in
  int32 arithmetic; power-of-two scales are built from their exponent bits, so
  scaling is exact;
* codes are written straight into the host byte regions through
  ``torch.from_numpy`` views (one device-to-host copy when the tensors live on
  an accelerator).

Scalars (coefficients, η, β, scales) are fp32 values passed as Python floats;
torch rounds them back to the same fp32 values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gm_core.numerics import minifloat
from gm_core.numerics.arrays import F32, U8
from gm_core.numerics.blocks import blocks
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions, cosine_from_gram, rda_factor, uses_rda
from gm_core.numerics.quant import F4_BLOCK, WireLayout
from gm_core.records import Alignment, MergeRule, WireFormat
from gm_shell.backends import bits

TORCH_BLOCK = 1 << 18
"""Elements per block. Larger than the numpy reference's block: each torch call costs a few
microseconds, and 1 MiB blocks still leave acc, θ and m in L2 of this machine's cores."""


def check_flat(x: torch.Tensor, n: int, what: str) -> None:
    assert x.dtype == torch.float32, f"{what}: dtype {x.dtype}, expected float32"
    assert x.shape == (n,), f"{what}: shape {tuple(x.shape)}, expected ({n},)"
    assert x.is_contiguous(), f"{what}: not contiguous"


class TorchBits:
    """torch's spelling of the bit operations in :mod:`gm_shell.backends.bits`."""

    def as_int32(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous().view(torch.int32)

    def as_float32(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int32).contiguous().view(torch.float32)

    def where(self, condition: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
        result: torch.Tensor = torch.where(condition, a, b)
        return result

    def round_even_int32(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x).to(torch.int32)


OPS = TorchBits()


E2M1_TABLE = torch.from_numpy(minifloat.E2M1.table())


class TorchBackend:
    """Flat fp32 torch tensors on ``device``."""

    name = "torch"

    def __init__(self, device: str | torch.device = "cpu", block: int = TORCH_BLOCK) -> None:
        assert block % F4_BLOCK == 0, "blocks must hold whole F4 scale blocks"
        self.device = torch.device(device)
        self.block = block
        self._scratch = torch.empty(0, dtype=torch.float32, device=self.device)

    def scratch(self, n: int) -> torch.Tensor:
        """Reusable fp32 scratch of ``n`` elements; contents are not preserved."""
        if self._scratch.shape[0] < n:
            self._scratch = torch.empty(n, dtype=torch.float32, device=self.device)
        return self._scratch[:n]

    def empty(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.float32, device=self.device)

    def asarray(self, x: F32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)

    def to_numpy(self, x: torch.Tensor) -> F32:
        result: F32 = x.detach().cpu().numpy()
        return result

    def all_finite(self, x: torch.Tensor) -> bool:
        if x.numel() == 0:
            return True
        low, high = torch.aminmax(x)
        return bool(torch.isfinite(low) & torch.isfinite(high))

    # -- merge ---------------------------------------------------------------------------

    def accumulate(
        self,
        deltas: Sequence[torch.Tensor],
        coefs: Sequence[float],
        acc: torch.Tensor,
        lo: int,
        hi: int,
        sq_norms: list[float] | None,
    ) -> None:
        """``acc = Σ c_i Δ_i[lo:hi]`` in learner order; optionally add ``‖Δ_i[lo:hi]‖²``."""
        for i, (delta, coef) in enumerate(zip(deltas, coefs, strict=True)):
            block = delta[lo:hi]
            if i == 0:
                torch.mul(block, coef, out=acc)
            else:
                acc.add_(block, alpha=coef)
            if sq_norms is not None:
                sq_norms[i] += float(torch.dot(block, block))

    def _check(self, deltas: Sequence[torch.Tensor], contributions: Contributions, n: int) -> None:
        assert len(deltas) == len(contributions.learners), "one delta per contribution"
        for i, delta in enumerate(deltas):
            check_flat(delta, n, f"delta {i}")

    def merge(
        self,
        deltas: Sequence[torch.Tensor],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        out: torch.Tensor,
    ) -> None:
        self._check(deltas, contributions, layout.total)
        check_flat(out, layout.total, "out")
        coefs = [float(c) for c in contributions.coefficients()]
        for span in layout.spans:
            rda = uses_rda(span, rule, embedding_pattern)
            sq_norms = [0.0] * len(deltas) if rda else None
            for lo, hi in blocks(span.start, span.stop, self.block):
                self.accumulate(deltas, coefs, out[lo:hi], lo, hi, sq_norms)
            if sq_norms is not None:
                part = out[span.start : span.stop]
                mean_sq = math.fsum(
                    float(torch.dot(part[lo:hi], part[lo:hi]))
                    for lo, hi in blocks(0, span.size, self.block)
                )
                factor = float(
                    np.float32(rda_factor(contributions.coefficients(), sq_norms, mean_sq))
                )
                part.mul_(factor)

    def nesterov_block(
        self,
        theta: torch.Tensor,
        momentum: torch.Tensor,
        delta: torch.Tensor,
        lr: float,
        beta: float,
    ) -> None:
        """``m ← βm + Δ; Θ ← Θ − η(Δ + βm)``; ``delta`` (a scratch block) is overwritten."""
        momentum.mul_(beta).add_(delta)
        delta.add_(momentum, alpha=beta)
        theta.sub_(delta, alpha=lr)

    def outer_step(
        self,
        theta: torch.Tensor,
        momentum: torch.Tensor,
        delta: torch.Tensor,
        lr: float,
        beta: float,
        *,
        final_only: bool,
    ) -> None:
        n = theta.shape[0]
        check_flat(delta, n, "delta")
        if final_only:
            theta.sub_(delta)
            return
        check_flat(momentum, n, "momentum")
        scratch = self.scratch(min(self.block, n))
        for lo, hi in blocks(0, n, self.block):
            tmp = scratch[: hi - lo]
            tmp.copy_(delta[lo:hi])
            self.nesterov_block(theta[lo:hi], momentum[lo:hi], tmp, lr, beta)

    def merge_step(
        self,
        deltas: Sequence[torch.Tensor],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        theta: torch.Tensor,
        momentum: torch.Tensor,
        lr: float,
        beta: float,
    ) -> None:
        n = layout.total
        check_flat(theta, n, "theta")
        check_flat(momentum, n, "momentum")
        final_only = contributions.all_final
        if final_only or any(uses_rda(s, rule, embedding_pattern) for s in layout.spans):
            merged = self.scratch(n)
            self.merge(deltas, contributions, layout, rule, embedding_pattern, merged)
            if final_only:
                theta.sub_(merged)
                return
            for lo, hi in blocks(0, n, self.block):
                self.nesterov_block(theta[lo:hi], momentum[lo:hi], merged[lo:hi], lr, beta)
            return
        self._check(deltas, contributions, n)
        coefs = [float(c) for c in contributions.coefficients()]
        scratch = self.scratch(min(self.block, n))
        for lo, hi in blocks(0, n, self.block):
            acc = scratch[: hi - lo]
            self.accumulate(deltas, coefs, acc, lo, hi, None)
            self.nesterov_block(theta[lo:hi], momentum[lo:hi], acc, lr, beta)

    def cosine(self, deltas: Sequence[torch.Tensor]) -> float | None:
        k = len(deltas)
        if k < 2:
            return None
        n = deltas[0].shape[0]
        gram = np.zeros((k, k), dtype=np.float64)
        rows = torch.empty((k, min(self.block, n)), dtype=torch.float32, device=self.device)
        for lo, hi in blocks(0, n, self.block):
            block = rows[:, : hi - lo]
            for i, delta in enumerate(deltas):
                block[i].copy_(delta[lo:hi])
            gram += (block @ block.T).double().cpu().numpy()
        return cosine_from_gram(gram)

    # -- alignment -----------------------------------------------------------------------

    def align(
        self,
        theta: torch.Tensor,
        committed: torch.Tensor,
        alignment: Alignment,
        mixing: float = 1.0,
        snapshot: torch.Tensor | None = None,
    ) -> None:
        n = theta.shape[0]
        check_flat(committed, n, "committed")
        if alignment is Alignment.OVERWRITE:
            theta.copy_(committed)
        elif alignment is Alignment.BLEND:
            assert 0.0 <= mixing <= 1.0, f"mixing {mixing} outside [0, 1]"
            keep, take = float(np.float32(1.0 - mixing)), float(np.float32(mixing))
            theta.mul_(keep).add_(committed, alpha=take)
        else:
            assert snapshot is not None, "carry needs the parameters at snapshot time"
            check_flat(snapshot, n, "snapshot")
            theta.sub_(snapshot).add_(committed)

    # -- codecs --------------------------------------------------------------------------

    def encode(self, x: torch.Tensor, wire: WireLayout, codes: U8, scales: U8) -> None:
        check_flat(x, wire.layout.total, "x")
        host_codes, host_scales = torch.from_numpy(codes), torch.from_numpy(scales)
        fmt = wire.format
        if fmt in (WireFormat.F32, WireFormat.F16, WireFormat.BF16):
            dtype = {WireFormat.F32: torch.float32, WireFormat.F16: torch.float16}
            host_codes.view(dtype.get(fmt, torch.bfloat16)).copy_(x)
            return
        for tensor in wire.tensors:
            values = x[tensor.span.start : tensor.span.stop]
            region = host_codes[tensor.codes[0] : tensor.codes[1]]
            scale = host_scales[tensor.scales[0] : tensor.scales[1]]
            if fmt is WireFormat.F8_E4M3:
                self.encode_f8(values, region, scale)
            else:
                self.encode_f4(values, region, scale)

    def encode_f8(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
        if x.numel() == 0:
            amax = torch.zeros(1, dtype=torch.float32, device=self.device)
        else:
            low, high = torch.aminmax(x)
            amax = torch.maximum(high, -low).reshape(1)
        k = bits.scale_exponents(amax, minifloat.E4M3, OPS)
        scale.copy_((k + 127).to(torch.uint8))
        inverse = float(2.0 ** -int(k[0]))
        tmp = self.scratch(min(self.block, x.shape[0]))
        for lo, hi in blocks(0, x.shape[0], self.block):
            y = torch.mul(x[lo:hi], inverse, out=tmp[: hi - lo])
            codes[lo:hi].view(torch.float8_e4m3fn).copy_(y)

    def encode_f4(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
        for lo, hi in blocks(0, x.shape[0], self.block):
            count = -(-(hi - lo) // F4_BLOCK)
            chunk = torch.zeros(count * F4_BLOCK, dtype=torch.float32, device=self.device)
            chunk[: hi - lo] = x[lo:hi]
            chunk = chunk.view(count, F4_BLOCK)
            k = bits.scale_exponents(chunk.abs().amax(dim=1), minifloat.E2M1, OPS)
            scale[lo // F4_BLOCK : lo // F4_BLOCK + count].copy_((k + 127).to(torch.uint8))
            y = chunk * bits.power_of_two(-k, OPS)[:, None]
            nibbles = bits.encode_minifloat(y, minifloat.E2M1, OPS).view(-1)
            packed = (nibbles[0::2] | (nibbles[1::2] << 4)).to(torch.uint8)
            n_bytes = -(-(hi - lo) // 2)
            codes[lo // 2 : lo // 2 + n_bytes].copy_(packed[:n_bytes])

    def decode(self, codes: U8, scales: U8, wire: WireLayout, out: torch.Tensor) -> None:
        check_flat(out, wire.layout.total, "out")
        host_codes = torch.from_numpy(codes).to(self.device)
        host_scales = torch.from_numpy(scales).to(self.device)
        fmt = wire.format
        if fmt in (WireFormat.F32, WireFormat.F16, WireFormat.BF16):
            dtype = {WireFormat.F32: torch.float32, WireFormat.F16: torch.float16}
            out.copy_(host_codes.view(dtype.get(fmt, torch.bfloat16)))
            return
        for tensor in wire.tensors:
            values = out[tensor.span.start : tensor.span.stop]
            region = host_codes[tensor.codes[0] : tensor.codes[1]]
            exponents = host_scales[tensor.scales[0] : tensor.scales[1]].to(torch.int32) - 127
            if fmt is WireFormat.F8_E4M3:
                values.copy_(region.view(torch.float8_e4m3fn)).mul_(
                    bits.power_of_two(exponents, OPS)
                )
            else:
                self.decode_f4(region, exponents, values)

    def decode_f4(self, codes: torch.Tensor, exponents: torch.Tensor, out: torch.Tensor) -> None:
        table = E2M1_TABLE.to(self.device)
        for lo, hi in blocks(0, out.shape[0], self.block):
            count = -(-(hi - lo) // F4_BLOCK)
            packed = codes[lo // 2 : lo // 2 + -(-(hi - lo) // 2)]
            nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=1).view(-1).to(torch.int64)
            values = torch.zeros(count * F4_BLOCK, dtype=torch.float32, device=self.device)
            values[: nibbles.shape[0]] = table[nibbles]
            first = lo // F4_BLOCK
            factors = bits.power_of_two(exponents[first : first + count], OPS)
            out[lo:hi] = (values.view(count, F4_BLOCK) * factors[:, None]).view(-1)[: hi - lo]

    # -- error feedback ------------------------------------------------------------------

    def publish_update(
        self, master: torch.Tensor, mirror: torch.Tensor, wire: WireLayout, codes: U8, scales: U8
    ) -> None:
        n = wire.layout.total
        difference = self.scratch(2 * n)[n:]  # apply_update below uses the first n
        torch.sub(master, mirror, out=difference)
        self.encode(difference, wire, codes, scales)
        self.apply_update(mirror, codes, scales, wire)

    def apply_update(self, theta: torch.Tensor, codes: U8, scales: U8, wire: WireLayout) -> None:
        update = self.scratch(wire.layout.total)
        self.decode(codes, scales, wire, update)
        theta.add_(update)
