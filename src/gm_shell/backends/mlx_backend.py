"""The MLX backend: gm's numerics on flat fp32 ``mlx.core`` arrays.

Theory of operation
-------------------
MLX arrays are values in a lazy graph, not mutable memory; "in place" here means
the caller's array object is rebound to the result through ``x[...] = result``,
so every holder of that object sees the update, as with the other backends. The
elementwise work of a merge and an outer step is one compiled function
(``mx.compile``) so MLX fuses it into a single kernel without temporaries.
Coefficients, η and β enter those functions as arrays, not Python constants, so a
new round does not trigger a recompilation.

Codecs use MLX's own fp16/bf16/fp8-E4M3 conversions (round to nearest even, as
the reference) and, for E2M1 and the scales, the shared bit formulas of
:mod:`gm_shell.backends.bits`. Codes are produced in MLX memory and copied once
into the host byte regions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from gm_core.numerics import minifloat
from gm_core.numerics.arrays import F32, U8
from gm_core.numerics.blocks import blocks
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions, cosine_from_gram, rda_factor, uses_rda
from gm_core.numerics.quant import F4_BLOCK, WireLayout
from gm_core.numerics.robust import spread_by
from gm_core.records import Alignment, MergeRule, WireFormat
from gm_shell.backends import bits


class MlxBits:
    """MLX's spelling of the bit operations in :mod:`gm_shell.backends.bits`."""

    def as_int32(self, x: mx.array) -> mx.array:
        return mx.view(x, mx.int32)

    def as_float32(self, x: mx.array) -> mx.array:
        return mx.view(x.astype(mx.int32), mx.float32)

    def where(self, condition: mx.array, a: Any, b: Any) -> mx.array:
        return mx.where(condition, a, b)

    def round_even_int32(self, x: mx.array) -> mx.array:
        return mx.round(x).astype(mx.int32)

    def int_to_float32(self, x: mx.array) -> mx.array:
        return x.astype(mx.float32)


OPS = MlxBits()


def check_flat(x: mx.array, n: int, what: str) -> None:
    assert x.dtype == mx.float32, f"{what}: dtype {x.dtype}, expected float32"
    assert tuple(x.shape) == (n,), f"{what}: shape {tuple(x.shape)}, expected ({n},)"


def weighted_sum(coefs: mx.array, *deltas: mx.array) -> mx.array:
    """``Σ c_i Δ_i`` in learner order, as the reference sums it."""
    acc = deltas[0] * coefs[0]
    for i in range(1, len(deltas)):
        acc = acc + deltas[i] * coefs[i]
    return acc


def nesterov(
    theta: mx.array, momentum: mx.array, delta: mx.array, lr: mx.array, beta: mx.array
) -> tuple[mx.array, mx.array]:
    """``m ← βm + Δ; Θ ← Θ − η(Δ + βm)`` in the reference's element order."""
    momentum = momentum * beta + delta
    return theta - (momentum * beta + delta) * lr, momentum


def fused_step(
    coefs: mx.array,
    lr: mx.array,
    beta: mx.array,
    theta: mx.array,
    momentum: mx.array,
    *deltas: mx.array,
) -> tuple[mx.array, mx.array]:
    return nesterov(theta, momentum, weighted_sum(coefs, *deltas), lr, beta)


def blend(theta: mx.array, committed: mx.array, keep: mx.array, take: mx.array) -> mx.array:
    return theta * keep + committed * take


WEIGHTED_SUM: Callable[..., mx.array] = mx.compile(weighted_sum, shapeless=True)
NESTEROV: Callable[..., tuple[mx.array, mx.array]] = mx.compile(nesterov, shapeless=True)
FUSED_STEP: Callable[..., tuple[mx.array, mx.array]] = mx.compile(fused_step, shapeless=True)
BLEND: Callable[..., mx.array] = mx.compile(blend, shapeless=True)
E2M1_TABLE = mx.array(minifloat.E2M1.table())


def f32(value: float) -> mx.array:
    """A float32 scalar array holding ``value`` rounded once to fp32."""
    return mx.array(float(np.float32(value)), dtype=mx.float32)


def scalar(x: mx.array) -> float:
    value = x.item()
    assert isinstance(value, float), value
    return value


def sq_norm(x: mx.array) -> float:
    """Squared norm, fp32 sums per block and float64 across blocks, like the reference."""
    return math.fsum(scalar(mx.sum(x[lo:hi] * x[lo:hi])) for lo, hi in blocks(0, x.shape[0]))


def _dot(a: mx.array, b: mx.array) -> float:
    return scalar(mx.sum(a * b))


def trimmed_block(rows: mx.array, shares: mx.array, trim: int) -> mx.array:
    """The reference's trimmed, share-weighted mean of each column of ``rows`` (k × b).

    MLX documents no stable sort: equal values of learners with unequal shares may be
    kept in another order than the reference's (only exact ties, e.g. zeros, differ).
    """
    k = rows.shape[0]
    order = mx.argsort(rows, axis=0)[trim : k - trim]
    kept, weights = mx.take_along_axis(rows, order, axis=0), shares[order]
    total = mx.sum(weights, axis=0)
    positive = total > 0.0
    mean = mx.sum(kept * weights, axis=0) / mx.where(positive, total, 1.0)
    return mx.where(positive, mean, mx.mean(kept, axis=0))


class MlxBackend:
    """Flat fp32 MLX arrays on MLX's default device."""

    name = "mlx"

    def empty(self, n: int) -> mx.array:
        return mx.zeros((n,), dtype=mx.float32)

    def asarray(self, x: F32) -> mx.array:
        return mx.array(np.ascontiguousarray(x, dtype=np.float32))

    def to_numpy(self, x: mx.array) -> F32:
        return np.array(x, dtype=np.float32)

    def all_finite(self, x: mx.array) -> bool:
        return bool(mx.all(mx.isfinite(x)).item()) if x.size else True

    def _coefs(self, deltas: Sequence[mx.array], contributions: Contributions, n: int) -> mx.array:
        assert len(deltas) == len(contributions.learners), "one delta per contribution"
        for i, delta in enumerate(deltas):
            check_flat(delta, n, f"delta {i}")
        return mx.array(np.array(contributions.coefficients(), dtype=np.float32))

    def merge(
        self,
        deltas: Sequence[mx.array],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        out: mx.array,
    ) -> None:
        check_flat(out, layout.total, "out")
        coefs = self._coefs(deltas, contributions, layout.total)
        if contributions.trim > 0:
            assert rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN), f"{rule} trims nothing"
            out[...] = self._trimmed(deltas, contributions, layout.total)
            mx.eval(out)
            return
        parts: list[mx.array] = []
        for span in layout.spans:
            pieces = [d[span.start : span.stop] for d in deltas]
            mean = WEIGHTED_SUM(coefs, *pieces)
            if uses_rda(span, rule, embedding_pattern):
                norms = [sq_norm(piece) for piece in pieces]
                factor = rda_factor(contributions.coefficients(), norms, sq_norm(mean))
                mean = mean * f32(factor)
            parts.append(mean)
        out[...] = mx.concatenate(parts) if parts else out
        mx.eval(out)

    def _trimmed(
        self, deltas: Sequence[mx.array], contributions: Contributions, n: int
    ) -> mx.array:
        shares = mx.array(np.array(contributions.shares(), dtype=np.float32))
        scales = [f32(float(s)) for s in contributions.row_scales()]
        parts = [
            trimmed_block(
                mx.stack([d[lo:hi] * s for d, s in zip(deltas, scales, strict=True)]),
                shares,
                contributions.trim,
            )
            for lo, hi in blocks(0, n)
        ]
        return mx.concatenate(parts) if parts else mx.zeros((0,), dtype=mx.float32)

    def outer_step(
        self,
        theta: mx.array,
        momentum: mx.array,
        delta: mx.array,
        lr: float,
        beta: float,
        *,
        final_only: bool,
    ) -> None:
        check_flat(delta, theta.shape[0], "delta")
        if final_only:
            theta[...] = theta - delta
            mx.eval(theta)
            return
        new_theta, new_momentum = NESTEROV(theta, momentum, delta, f32(lr), f32(beta))
        theta[...], momentum[...] = new_theta, new_momentum
        mx.eval(theta, momentum)

    def merge_step(
        self,
        deltas: Sequence[mx.array],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        theta: mx.array,
        momentum: mx.array,
        lr: float,
        beta: float,
        out: mx.array | None = None,
    ) -> None:
        n = layout.total
        check_flat(theta, n, "theta")
        check_flat(momentum, n, "momentum")
        dest = theta if out is None else out
        check_flat(dest, n, "out")
        final_only = contributions.all_final
        sorts = contributions.trim > 0
        if final_only or sorts or any(uses_rda(s, rule, embedding_pattern) for s in layout.spans):
            merged = self.empty(n)
            self.merge(deltas, contributions, layout, rule, embedding_pattern, merged)
            if dest is not theta:
                dest[...] = theta
            self.outer_step(dest, momentum, merged, lr, beta, final_only=final_only)
            return
        coefs = self._coefs(deltas, contributions, n)
        new_theta, new_momentum = FUSED_STEP(coefs, f32(lr), f32(beta), theta, momentum, *deltas)
        dest[...], momentum[...] = new_theta, new_momentum
        mx.eval(dest, momentum)

    def cosine(self, deltas: Sequence[mx.array]) -> float | None:
        k = len(deltas)
        if k < 2:
            return None
        gram = np.zeros((k, k), dtype=np.float64)
        for lo, hi in blocks(0, deltas[0].shape[0]):
            rows = mx.stack([d[lo:hi] for d in deltas])
            gram += np.array(rows @ rows.T, dtype=np.float64)
        return cosine_from_gram(gram)

    def spread(
        self, deltas: Sequence[mx.array], centre: mx.array
    ) -> tuple[list[float], list[float]]:
        return spread_by(deltas, centre, _dot, centre.shape[0])

    def align(
        self,
        theta: mx.array,
        committed: mx.array,
        alignment: Alignment,
        mixing: float = 1.0,
        snapshot: mx.array | None = None,
    ) -> None:
        check_flat(committed, theta.shape[0], "committed")
        if alignment is Alignment.OVERWRITE:
            theta[...] = committed
        elif alignment is Alignment.BLEND:
            assert 0.0 <= mixing <= 1.0, f"mixing {mixing} outside [0, 1]"
            theta[...] = BLEND(theta, committed, f32(1.0 - mixing), f32(mixing))
        else:
            assert snapshot is not None, "carry needs the parameters at snapshot time"
            check_flat(snapshot, theta.shape[0], "snapshot")
            theta[...] = (theta - snapshot) + committed
        mx.eval(theta)

    # -- codecs --------------------------------------------------------------------------

    def encode(self, x: mx.array, wire: WireLayout, codes: U8, scales: U8) -> None:
        check_flat(x, wire.layout.total, "x")
        fmt = wire.format
        if fmt is WireFormat.F32:
            codes.view(np.float32)[:] = np.array(x, copy=False)
        elif fmt is WireFormat.F16:
            codes.view(np.float16)[:] = np.array(x.astype(mx.float16), copy=False)
        elif fmt is WireFormat.BF16:
            codes.view(np.uint16)[:] = np.array(mx.view(x.astype(mx.bfloat16), mx.uint16))
        else:
            for tensor in wire.tensors:
                values = x[tensor.span.start : tensor.span.stop]
                region = codes[tensor.codes[0] : tensor.codes[1]]
                scale = scales[tensor.scales[0] : tensor.scales[1]]
                if fmt is WireFormat.F8_E4M3:
                    self.encode_f8(values, region, scale)
                else:
                    self.encode_f4(values, region, scale)

    def encode_f8(self, x: mx.array, codes: U8, scale: U8) -> None:
        amax = mx.maximum(mx.max(x), -mx.min(x)) if x.size else mx.array(0.0)
        k = bits.scale_exponents(amax.reshape(1), minifloat.E4M3, OPS)
        scale_bytes = bits.scale_bytes(k, amax.reshape(1), OPS)
        scale[:] = np.array(scale_bytes.astype(mx.uint8))
        fp8 = mx.to_fp8(x * bits.power_of_two(-k, OPS))
        # A NaN or ±Inf inside: NaN scale (above) and zero codes, as the reference.
        codes[:] = np.array(mx.where(scale_bytes == minifloat.SCALE_NAN_BYTE, 0, fp8))

    def encode_f4(self, x: mx.array, codes: U8, scale: U8) -> None:
        count = -(-x.shape[0] // F4_BLOCK)
        padded = mx.pad(x, (0, count * F4_BLOCK - x.shape[0])).reshape(count, F4_BLOCK)
        amax = mx.max(mx.abs(padded), axis=1)
        k = bits.scale_exponents(amax, minifloat.E2M1, OPS)
        scale_bytes = bits.scale_bytes(k, amax, OPS)
        scale[:] = np.array(scale_bytes.astype(mx.uint8))
        # Zero codes where a NaN or ±Inf made the scale NaN, as the reference.
        bad = (scale_bytes == minifloat.SCALE_NAN_BYTE)[:, None]
        y = mx.where(bad, 0.0, padded) * bits.power_of_two(-k, OPS)[:, None]
        nibbles = bits.encode_minifloat(y, minifloat.E2M1, OPS).reshape(-1)
        packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(mx.uint8)
        codes[:] = np.array(packed[: codes.shape[0]])

    def decode(self, codes: U8, scales: U8, wire: WireLayout, out: mx.array) -> None:
        check_flat(out, wire.layout.total, "out")
        fmt = wire.format
        if fmt in (WireFormat.F32, WireFormat.F16):
            out[...] = mx.array(codes.view(np.float32 if fmt is WireFormat.F32 else np.float16))
        elif fmt is WireFormat.BF16:
            out[...] = mx.view(mx.array(codes.view(np.uint16)), mx.bfloat16).astype(mx.float32)
        else:
            parts = []
            for tensor in wire.tensors:
                region = mx.array(codes[tensor.codes[0] : tensor.codes[1]])
                exponents = mx.array(scales[tensor.scales[0] : tensor.scales[1]]).astype(mx.int32)
                factors = bits.power_of_two(exponents - 127, OPS)
                if fmt is WireFormat.F8_E4M3:
                    parts.append(mx.from_fp8(region, dtype=mx.float32) * factors)
                else:
                    parts.append(self.decode_f4(region, factors, tensor.span.size))
            out[...] = mx.concatenate(parts) if parts else out
        mx.eval(out)

    def decode_f4(self, packed: mx.array, factors: mx.array, size: int) -> mx.array:
        nibbles = mx.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1)
        count = factors.shape[0]
        values = mx.pad(mx.take(E2M1_TABLE, nibbles), (0, count * F4_BLOCK - nibbles.shape[0]))
        return (values.reshape(count, F4_BLOCK) * factors[:, None]).reshape(-1)[:size]

    # -- error feedback ------------------------------------------------------------------

    def publish_update(
        self, master: mx.array, mirror: mx.array, wire: WireLayout, codes: U8, scales: U8
    ) -> None:
        self.encode(master - mirror, wire, codes, scales)
        self.apply_update(mirror, codes, scales, wire)

    def apply_update(self, theta: mx.array, codes: U8, scales: U8, wire: WireLayout) -> None:
        update = self.empty(wire.layout.total)
        self.decode(codes, scales, wire, update)
        theta[...] = theta + update
        mx.eval(theta)
