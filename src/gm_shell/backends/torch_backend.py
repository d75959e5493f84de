"""The torch backend: gm's numerics on flat fp32 torch tensors (CPU, CUDA or MPS).

Theory of operation
-------------------
Same algorithm and element order as the numpy reference, expressed with torch's
in-place kernels so nothing full-size is allocated per call:

* merges and outer steps walk the fragment in cache-sized blocks; a block's
  merged delta is accumulated with ``mul(out=)`` and ``add_(alpha=)`` in a
  scratch that stays in cache, and is consumed there by the Nesterov update, so
  main memory sees each delta read once and θ and m read and written once;
* on CPU, blocks are kept at torch's parallel grain (32768 elements), where each
  op runs inline without waking its thread pool (a fixed cost that dominated at
  this size), and the fragment is instead split into one contiguous range per
  core, each walked by a thread of our own (torch releases the GIL inside ops).
  Results do not depend on the split except the per-range partial sums of RDA
  norms, which are added in range order, so they are deterministic;
* codecs use torch's own fp16/bf16/fp8-E4M3 conversions (round to nearest even,
  as the reference) and, for E2M1, the reference's bit-level rounding written in
  int32 arithmetic; power-of-two scales are built from their exponent bits, so
  scaling is exact;
* codes are written straight into the host byte regions through
  ``torch.from_numpy`` views on CPU; on an accelerator they are made in device
  buffers and copied to the host once per call (codes, scales), and decoding
  copies the host codes to the device once, so a codec waits for the device at
  most once, never per tensor.

Scalars (coefficients, η, β, scales) are fp32 values passed as Python floats;
torch rounds them back to the same fp32 values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch

from gm_core.numerics import minifloat
from gm_core.numerics.arrays import F32, U8
from gm_core.numerics.blocks import blocks
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import (
    Contributions,
    cosine_from_gram,
    needs_whole,
    rda_factor,
    uses_rda,
)
from gm_core.numerics.quant import F4_BLOCK, WireLayout
from gm_core.numerics.robust import spread_by
from gm_core.records import Alignment, MergeRule, WireFormat
from gm_shell.backends import bits

CPU_BLOCK = 1 << 15
"""torch's internal parallel grain: smaller ops run inline on the calling thread."""
ACCELERATOR_BLOCK = 1 << 22
"""On a GPU each op is a kernel launch: blocks large enough to fill the device."""
CODEC_BLOCK = 1 << 20
"""On accelerators codecs chain a dozen ops per chunk: 4 MiB chunks amortize launches. On CPU
codec chunks stay at the parallel grain like merge blocks: measured here, ops that wake torch's
thread pool (or follow one that did) cost 10-50x more on a loaded machine."""

T = TypeVar("T")


def check_flat(x: torch.Tensor, n: int, what: str) -> None:
    assert x.dtype == torch.float32, f"{what}: dtype {x.dtype}, expected float32"
    assert x.shape == (n,), f"{what}: shape {tuple(x.shape)}, expected ({n},)"
    assert x.is_contiguous(), f"{what}: not contiguous"


def host_tensor(a: U8) -> torch.Tensor:
    """A tensor over host bytes, copied first when they are read-only (a payload's codes as
    the bucket returned them): torch has no read-only tensors, and warns on one."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


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
        # Adding then subtracting 2^23 rounds to an integer, ties to even, for 0 ≤ x < 2^22,
        # with two plain adds: torch.round and reductions wake the thread pool, which cost
        # milliseconds per call on a loaded machine (measured with torch.profiler).
        return ((x + 8388608.0) - 8388608.0).to(torch.int32)

    def int_to_float32(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)


OPS = TorchBits()


def nesterov_block(
    theta: torch.Tensor, momentum: torch.Tensor, delta: torch.Tensor, lr: float, beta: float
) -> None:
    """``m ← βm + Δ; Θ ← Θ − η(Δ + βm)``; ``delta`` (a scratch block) is overwritten."""
    momentum.mul_(beta).add_(delta)
    delta.add_(momentum, alpha=beta)
    theta.sub_(delta, alpha=lr)


def accumulate(
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


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b))


def trimmed_block(rows: torch.Tensor, shares: torch.Tensor, trim: int, out: torch.Tensor) -> None:
    """The reference's trimmed, share-weighted mean of each column of ``rows`` (k × b)."""
    k = rows.shape[0]
    values, order = torch.sort(rows, dim=0, stable=True)
    kept, weights = values[trim : k - trim], shares[order[trim : k - trim]]
    total = weights.sum(dim=0)
    positive = total > 0.0
    torch.div((kept * weights).sum(dim=0), torch.where(positive, total, 1.0), out=out)
    if not bool(positive.all()):
        out[~positive] = kept.mean(dim=0)[~positive]


def block_amax(chunk: torch.Tensor) -> torch.Tensor:
    """Max |x| of each row by halving with elementwise maxima (see ``round_even_int32``)."""
    width = chunk.shape[1]
    folded = chunk.abs()
    while width > 1:
        width //= 2
        folded = torch.maximum(folded[:, :width], folded[:, width : 2 * width])
    return folded[:, 0].contiguous()


class TorchBackend:
    """Flat fp32 torch tensors on ``device``.

    ``threads`` ranges are walked concurrently (default: torch's CPU thread count on
    CPU, one on accelerators); ``block`` is the element count of one cached block of a
    merge, ``codec_block`` that of one chunk of a codec.
    """

    name = "torch"

    def __init__(
        self,
        device: str | torch.device = "cpu",
        block: int | None = None,
        threads: int | None = None,
        codec_block: int | None = None,
    ) -> None:
        self.device = torch.device(device)
        cpu = self.device.type == "cpu"
        self.block = block or (CPU_BLOCK if cpu else ACCELERATOR_BLOCK)
        assert self.block % F4_BLOCK == 0, "blocks must hold whole F4 scale blocks"
        self.codec_block = codec_block or (self.block if cpu else CODEC_BLOCK)
        assert self.codec_block % F4_BLOCK == 0, "codec blocks must hold whole F4 scale blocks"
        self.threads = threads or (torch.get_num_threads() if cpu else 1)
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        self._scratch: dict[str, torch.Tensor] = {}

    def scratch(self, n: int, purpose: str) -> torch.Tensor:
        """Reusable fp32 buffer of ``n`` elements per purpose; contents are not preserved."""
        buffer = self._scratch.get(purpose)
        if buffer is None or buffer.shape[0] < n:
            buffer = torch.empty(n, dtype=torch.float32, device=self.device)
            self._scratch[purpose] = buffer
        return buffer[:n]

    def ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Split ``[lo, hi)`` into up to ``threads`` runs of whole blocks."""
        whole = -(-(hi - lo) // self.block)
        parts = max(1, min(self.threads, whole // 4))  # tiny spans are not worth a thread
        cuts = [lo + min(hi - lo, (whole * i // parts) * self.block) for i in range(parts + 1)]
        return [(a, b) for a, b in itertools.pairwise(cuts) if b > a] or [(lo, hi)]

    def in_ranges(self, work: Callable[[int, int, int], T], lo: int, hi: int) -> list[T]:
        """``work(slot, a, b)`` over :meth:`ranges`, concurrently; results in range order."""
        parts = self.ranges(lo, hi)
        if self._pool is None or len(parts) == 1:
            return [work(slot, a, b) for slot, (a, b) in enumerate(parts)]
        futures = [self._pool.submit(work, slot, a, b) for slot, (a, b) in enumerate(parts)]
        return [future.result() for future in futures]

    def slot(self, index: int, n: int) -> torch.Tensor:
        """Per-range block scratch ``index``; the first ``threads`` blocks of scratch."""
        blocks_buffer = self.scratch(self.threads * self.block, "blocks")
        return blocks_buffer[index * self.block : index * self.block + n]

    def empty(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.float32, device=self.device)

    def asarray(self, x: F32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)

    def to_numpy(self, x: torch.Tensor) -> F32:
        result: F32 = x.detach().cpu().numpy()
        return result

    def all_finite(self, x: torch.Tensor) -> bool:
        """min and max propagate NaN and expose ±Inf. On an accelerator: one reduction, one
        wait for its answer. On CPU: block by block over our ranges, like the merges (one
        reduction over a whole fragment wakes torch's thread pool: 3.9 ms for 4 MiB on this
        2-core machine under load, against 0.08 ms for numpy's)."""
        if x.numel() == 0:
            return True
        if self.device.type != "cpu":
            low, high = torch.aminmax(x)
            return bool(torch.isfinite(low) & torch.isfinite(high))

        def run(_: int, lo: int, hi: int) -> bool:
            for a, b in blocks(lo, hi, self.block):
                low, high = torch.aminmax(x[a:b])
                if not (math.isfinite(float(low)) and math.isfinite(float(high))):
                    return False
            return True

        return all(self.in_ranges(run, 0, x.shape[0]))

    # -- merge ---------------------------------------------------------------------------

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
        if contributions.trim > 0:
            assert rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN), f"{rule} trims nothing"
            self._trimmed(deltas, contributions, out)
            return
        coefs = [float(c) for c in contributions.coefficients()]
        for span in layout.spans:
            rda = uses_rda(span, rule, embedding_pattern)

            def run(_: int, lo: int, hi: int, rda: bool = rda) -> list[float]:
                sq_norms = [0.0] * len(deltas)
                for a, b in blocks(lo, hi, self.block):
                    accumulate(deltas, coefs, out[a:b], a, b, sq_norms if rda else None)
                return sq_norms

            partials = self.in_ranges(run, span.start, span.stop)
            if rda:
                sq_norms = [math.fsum(p[i] for p in partials) for i in range(len(deltas))]
                part = out[span.start : span.stop]
                mean_sq = math.fsum(
                    float(torch.dot(part[a:b], part[a:b]))
                    for a, b in blocks(0, span.size, self.block)
                )
                factor = rda_factor(contributions.coefficients(), sq_norms, mean_sq)
                part.mul_(float(np.float32(factor)))

    def _trimmed(
        self, deltas: Sequence[torch.Tensor], contributions: Contributions, out: torch.Tensor
    ) -> None:
        """Coordinate-wise trimmed mean, one ``k × block`` stack per range."""
        trimmed = self._trimmer(deltas, contributions)

        def run(slot: int, lo: int, hi: int) -> None:
            for a, b in blocks(lo, hi, self.block):
                trimmed(slot, a, b, out[a:b])

        self.in_ranges(run, 0, out.shape[0])

    def _trimmer(
        self, deltas: Sequence[torch.Tensor], contributions: Contributions
    ) -> Callable[[int, int, int, torch.Tensor], None]:
        """What writes the trimmed mean of coordinates ``a:b`` (a block at most) into a
        buffer, through the ``k × block`` stack of the calling range's ``slot``."""
        shares = torch.tensor(
            [float(s) for s in contributions.shares()], dtype=torch.float32, device=self.device
        )
        scales = [float(s) for s in contributions.row_scales()]
        stacks: dict[int, torch.Tensor] = {}

        def trimmed(slot: int, a: int, b: int, out: torch.Tensor) -> None:
            stack = stacks.get(slot)  # each range (thread) its own, made on first use
            if stack is None or stack.shape[1] < b - a:
                stack = stacks[slot] = torch.empty((len(deltas), b - a), device=self.device)
            rows = stack[:, : b - a]
            for i, delta in enumerate(deltas):
                torch.mul(delta[a:b], scales[i], out=rows[i])
            trimmed_block(rows, shares, contributions.trim, out)

        return trimmed

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

        def run(slot: int, lo: int, hi: int) -> None:
            for a, b in blocks(lo, hi, self.block):
                tmp = self.slot(slot, b - a).copy_(delta[a:b])
                nesterov_block(theta[a:b], momentum[a:b], tmp, lr, beta)

        self.in_ranges(run, 0, n)

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
        out: torch.Tensor | None = None,
    ) -> None:
        n = layout.total
        check_flat(theta, n, "theta")
        check_flat(momentum, n, "momentum")
        dest = theta if out is None else out
        check_flat(dest, n, "out")
        final_only = contributions.all_final
        if needs_whole(contributions, layout, rule, embedding_pattern):
            merged = self.scratch(n, "merged")
            self.merge(deltas, contributions, layout, rule, embedding_pattern, merged)
            if dest is not theta:
                dest.copy_(theta)
            self.outer_step(dest, momentum, merged, lr, beta, final_only=final_only)
            return
        self._check(deltas, contributions, n)
        merged_block = self._merger(deltas, contributions, rule)

        def run(slot: int, lo: int, hi: int) -> None:
            for a, b in blocks(lo, hi, self.block):
                acc = self.slot(slot, b - a)
                merged_block(slot, a, b, acc)
                if dest is not theta:
                    dest[a:b].copy_(theta[a:b])
                if final_only:
                    dest[a:b].sub_(acc)
                else:
                    nesterov_block(dest[a:b], momentum[a:b], acc, lr, beta)

        self.in_ranges(run, 0, n)

    def _merger(
        self, deltas: Sequence[torch.Tensor], contributions: Contributions, rule: MergeRule
    ) -> Callable[[int, int, int, torch.Tensor], None]:
        """What writes the merged delta of coordinates ``a:b`` (a block at most, in range
        ``slot``) into a buffer: the trimmed mean under a robust rule, else the weighted
        sum; bit for bit what :meth:`merge` writes there (see :mod:`gm_core.numerics.step`)."""
        if contributions.trim > 0:
            assert rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN), f"{rule} trims nothing"
            return self._trimmer(deltas, contributions)
        coefs = [float(c) for c in contributions.coefficients()]
        return lambda _, a, b, acc: accumulate(deltas, coefs, acc, a, b, None)

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

    def spread(
        self, deltas: Sequence[torch.Tensor], centre: torch.Tensor
    ) -> tuple[list[float], list[float]]:
        return spread_by(deltas, centre, _dot, centre.shape[0], self.block)

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
            self.assign(theta, committed)
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
            self.assign(host_codes.view(dtype.get(fmt, torch.bfloat16)), x)
            return
        # On an accelerator the codes are made in device buffers and cross to the host in
        # one copy each, at the end: no transfer (and no wait for the device) per tensor.
        cpu = self.device.type == "cpu"
        all_codes = host_codes if cpu else torch.empty_like(host_codes, device=self.device)
        all_scales = host_scales if cpu else torch.empty_like(host_scales, device=self.device)
        for tensor in wire.tensors:
            values = x[tensor.span.start : tensor.span.stop]
            region = all_codes[tensor.codes[0] : tensor.codes[1]]
            scale = all_scales[tensor.scales[0] : tensor.scales[1]]
            if fmt is WireFormat.F8_E4M3:
                self.encode_f8(values, region, scale)
            else:
                self.encode_f4(values, region, scale)
        if not cpu:
            host_codes.copy_(all_codes)
            host_scales.copy_(all_scales)

    def assign(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst ← src`` in ``dst``'s dtype: on CPU by codec blocks, each inline (one copy of
        a whole fragment wakes torch's thread pool: 3.3 ms against numpy's 0.4 ms for 4 MiB
        of bf16 on this machine under load); elsewhere one op (one transfer)."""
        if self.device.type != "cpu":
            dst.copy_(src)
            return
        for lo, hi in blocks(0, dst.shape[0], self.codec_block):
            dst[lo:hi].copy_(src[lo:hi])

    def encode_f8(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
        if x.numel() == 0:
            amax = torch.zeros(1, dtype=torch.float32, device=self.device)
        else:
            low, high = torch.aminmax(x)
            amax = torch.maximum(high, -low).reshape(1)
        k = bits.scale_exponents(amax, minifloat.E4M3, OPS)
        scale.copy_(bits.scale_bytes(k, amax, OPS).to(torch.uint8))
        inverse = bits.power_of_two(-k, OPS)  # exact, and stays on the device (no wait for it)
        tmp = self.scratch(min(self.codec_block, x.shape[0]), "codec")
        for lo, hi in blocks(0, x.shape[0], self.codec_block):
            y = torch.mul(x[lo:hi], inverse, out=tmp[: hi - lo])
            codes[lo:hi].view(torch.float8_e4m3fn).copy_(y)
        # A NaN or ±Inf inside: NaN scale (above) and zero codes, as the reference.
        bad = ~torch.isfinite(amax)
        if self.device.type != "cpu":
            codes.masked_fill_(bad, 0)  # no wait for the device
        elif bool(bad):
            codes.zero_()

    def encode_f4(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
        for lo, hi in blocks(0, x.shape[0], self.codec_block):
            count = -(-(hi - lo) // F4_BLOCK)
            chunk = torch.zeros(count * F4_BLOCK, dtype=torch.float32, device=self.device)
            chunk[: hi - lo] = x[lo:hi]
            chunk = chunk.view(count, F4_BLOCK)
            amax = block_amax(chunk)
            k = bits.scale_exponents(amax, minifloat.E2M1, OPS)
            scale_bytes = bits.scale_bytes(k, amax, OPS)
            scale[lo // F4_BLOCK : lo // F4_BLOCK + count].copy_(scale_bytes.to(torch.uint8))
            # Zero codes where a NaN or ±Inf made the scale NaN, as the reference (on CPU
            # only when there is one: a look costs nothing there, the fill a pass).
            bad = (scale_bytes == minifloat.SCALE_NAN_BYTE)[:, None]
            if self.device.type != "cpu" or bool(bad.any()):
                chunk.masked_fill_(bad, 0.0)
            y = chunk * bits.power_of_two(-k, OPS)[:, None]
            nibbles = bits.encode_minifloat(y, minifloat.E2M1, OPS).view(-1)
            packed = (nibbles[0::2] | (nibbles[1::2] << 4)).to(torch.uint8)
            n_bytes = -(-(hi - lo) // 2)
            codes[lo // 2 : lo // 2 + n_bytes].copy_(packed[:n_bytes])

    def decode(self, codes: U8, scales: U8, wire: WireLayout, out: torch.Tensor) -> None:
        check_flat(out, wire.layout.total, "out")
        host_codes = host_tensor(codes).to(self.device)
        host_scales = host_tensor(scales).to(self.device)
        fmt = wire.format
        if fmt in (WireFormat.F32, WireFormat.F16, WireFormat.BF16):
            dtype = {WireFormat.F32: torch.float32, WireFormat.F16: torch.float16}
            self.assign(out, host_codes.view(dtype.get(fmt, torch.bfloat16)))
            return
        for tensor in wire.tensors:
            values = out[tensor.span.start : tensor.span.stop]
            region = host_codes[tensor.codes[0] : tensor.codes[1]]
            exponents = host_scales[tensor.scales[0] : tensor.scales[1]].to(torch.int32) - 127
            if fmt is WireFormat.F8_E4M3:
                self.decode_f8(region, exponents, values)
            else:
                self.decode_f4(region, exponents, values)

    def decode_f8(self, codes: torch.Tensor, exponent: torch.Tensor, out: torch.Tensor) -> None:
        """One tensor's fp8 codes times its scale, by codec blocks (inline on CPU, see
        :meth:`assign`); the scale stays a tensor on the device (no wait for it)."""
        scale = bits.power_of_two(exponent, OPS)
        fp8 = codes.view(torch.float8_e4m3fn)
        for lo, hi in blocks(0, out.shape[0], self.codec_block):
            out[lo:hi].copy_(fp8[lo:hi]).mul_(scale)

    def decode_f4(self, codes: torch.Tensor, exponents: torch.Tensor, out: torch.Tensor) -> None:
        for lo, hi in blocks(0, out.shape[0], self.codec_block):
            count = -(-(hi - lo) // F4_BLOCK)
            packed = codes[lo // 2 : lo // 2 + -(-(hi - lo) // 2)].to(torch.int32)
            nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=1).view(-1)
            values = torch.zeros(count * F4_BLOCK, dtype=torch.float32, device=self.device)
            values[: nibbles.shape[0]] = bits.decode_minifloat(nibbles, minifloat.E2M1, OPS)
            first = lo // F4_BLOCK
            factors = bits.power_of_two(exponents[first : first + count], OPS)
            out[lo:hi] = (values.view(count, F4_BLOCK) * factors[:, None]).view(-1)[: hi - lo]

    # -- error feedback ------------------------------------------------------------------

    def publish_update(
        self, master: torch.Tensor, mirror: torch.Tensor, wire: WireLayout, codes: U8, scales: U8
    ) -> None:
        n = wire.layout.total
        difference = self.scratch(n, "difference")
        torch.sub(master, mirror, out=difference)
        self.encode(difference, wire, codes, scales)
        self.apply_update(mirror, codes, scales, wire)

    def apply_update(self, theta: torch.Tensor, codes: U8, scales: U8, wire: WireLayout) -> None:
        update = self.scratch(wire.layout.total, "update")
        self.decode(codes, scales, wire, update)
        theta.add_(update)
