"""Fragment payloads of one run: encode, check, decode and merge on host fp32 buffers.

Theory of operation
-------------------
Every tensor payload of a run is one fragment in one of three roles, each with
its wire format fixed by the manifest: a learner's *delta* (``delta_format``), a
committed *theta* (``commit_format``) and the closer's outer *momentum* (always
F32: it is state, not a message, and must survive a takeover exactly).
:class:`FragmentCodec` knows the layout of every fragment (from the manifest's
schema and plan) and turns flat fp32 host buffers into payload bytes and a
:class:`~gm_core.records.PayloadRef` and back.

Reading a payload judges it, in the order a closer must report it: absent
(``missing``), bytes that are not what the reference promised — wrong size or
blake3 digest, a zstd frame or safetensors header that does not parse
(``corrupt``), tensors that are not this fragment's (``schema``), values that are
NaN or ±Inf (``nonfinite``, deltas only: a committed theta is the run's truth).

Every read is bounded by the fragment's layout, never by what the bytes claim
(:meth:`FragmentCodec.limit`): the data of a fragment has an exact size, its
header at most :func:`~gm_shell.payload.header_limit` bytes, and its sealed form
at most the zstd worst case of that. A reference that declares more, a frame that
declares or decodes to more, a header longer or nested deeper are all ``corrupt``
(the wire has no other name for them: a reason a record carries must be one every
reader knows), refused before the memory they ask for is allocated.

All of it is CPU work for worker threads (payload hashing and compression refuse
to run on an event loop). Each thread gets its own :class:`PayloadWriter`.
Merges run on the chosen compute backend (torch where installed: on CPU its
arrays share memory with the host buffers, so nothing is copied).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from gm_core import keys, robust
from gm_core.auth import RunAuth
from gm_core.numerics import Contributions, Layout, WireLayout, wire_layout
from gm_core.numerics.arrays import F32
from gm_core.records import (
    AlgorithmConfig,
    Manifest,
    MergeRule,
    PayloadRef,
    Reason,
    WireFormat,
)
from gm_core.robust import MergePlan
from gm_core.verdicts import normalized_weights
from gm_shell.backends import Backend, NumpyBackend
from gm_shell.payload import (
    PayloadError,
    PayloadWriter,
    byte_view,
    content_hash,
    file_limit,
    fragment_entries,
    header_limit,
    read_fragment,
    read_payload,
    seal,
    sealed_limit,
    unseal,
    write_fragment,
)


class Role(enum.StrEnum):
    DELTA = "delta"
    THETA = "theta"
    MOMENTUM = "momentum"


class UnusablePayloadError(ValueError):
    """A payload that cannot be used, the protocol's name for why, and its key once known."""

    def __init__(self, reason: Reason, message: str, key: str = "") -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.detail = message
        self.key = key


@attrs.frozen
class Bounds:
    """Byte bounds of one fragment's payloads: header, file, and file as sealed."""

    header: int
    file: int
    sealed: int


def layouts_of(manifest: Manifest) -> list[Layout]:
    """Each fragment's flat layout: its tensors back to back, in plan order."""
    specs = {t.name: t for t in manifest.schema}
    return [Layout.from_specs(specs[n] for n in names) for names in manifest.plan.fragments]


def payload_key(run_auth: RunAuth | None) -> bytes | None:
    """The key payload digests are computed with in a run authenticated by ``run_auth``."""
    return None if run_auth is None else run_auth.payload_key


class FragmentCodec:
    """Payload bytes <-> flat fp32 buffers for the fragments of one run."""

    def __init__(
        self,
        manifest: Manifest,
        compute: Backend[Any] | None = None,
        payload_key: bytes | None = None,
    ) -> None:
        """``payload_key``: the run key's payload subkey in an authenticated run (digests
        are then keyed BLAKE3, which nobody without the key can match); None: open."""
        self.config: AlgorithmConfig = manifest.config
        self._payload_key = payload_key
        self.layouts = layouts_of(manifest)
        self._formats = {
            Role.DELTA: self.config.delta_format,
            Role.THETA: self.config.commit_format,
            Role.MOMENTUM: WireFormat.F32,
        }
        self._wires = {
            (f, fmt): wire_layout(layout, fmt)
            for f, layout in enumerate(self.layouts)
            for fmt in set(self._formats.values())
        }
        self._numpy = NumpyBackend()
        self._compute: Backend[Any] = compute or self._numpy
        self._local = threading.local()
        self._limits: dict[tuple[int, WireFormat], Bounds] = {}

    def wire(self, fragment: int, role: Role) -> WireLayout:
        return self._wires[(fragment, self._formats[role])]

    def size(self, fragment: int) -> int:
        return self.layouts[fragment].total

    def limit(self, fragment: int, role: Role) -> int:
        """The most bytes a payload of ``fragment`` in ``role`` can be in the bucket, as
        sealed: a reference that declares more, or an object bigger than its reference,
        is never downloaded."""
        return self._bounds(fragment, role).sealed

    def _bounds(self, fragment: int, role: Role) -> Bounds:
        at = (fragment, self._formats[role])
        bounds = self._limits.get(at)
        if bounds is None:  # computed once per fragment and format (any thread: idempotent)
            entries = fragment_entries(self._wires[at])
            file = file_limit(entries)
            bounds = Bounds(
                header=header_limit(entries),
                file=file,
                sealed=sealed_limit(file, self.config.compression),
            )
            self._limits[at] = bounds
        return bounds

    # -- writing --------------------------------------------------------------------------

    def encode(self, fragment: int, role: Role, round_: int, x: F32) -> tuple[bytes, PayloadRef]:
        """The bytes to upload for ``x`` and the reference a record will carry."""
        writer: PayloadWriter | None = getattr(self._local, "writer", None)
        if writer is None:
            writer = self._local.writer = PayloadWriter()
        file = write_fragment(writer, self._numpy, x, self.wire(fragment, role))
        data = bytes(byte_view(seal(file, self.config.compression)))
        digest = content_hash(data, self._payload_key)
        ref = PayloadRef(key=keys.payload(round_, digest), size=len(data), digest=digest)
        return data, ref

    def roundtrip(self, fragment: int, role: Role, x: F32, data: bytes) -> F32:
        """What every reader of ``data`` will get: ``x`` itself when the format is exact."""
        if self._formats[role] is WireFormat.F32:
            return x
        return self.decode(fragment, role, data)

    # -- reading --------------------------------------------------------------------------

    def check(self, ref: PayloadRef, data: bytes | None) -> None:
        """Raise UnusablePayloadError unless ``data`` is exactly the bytes ``ref`` names."""
        if data is None:
            raise UnusablePayloadError(Reason.MISSING, f"{ref.key} is absent")
        if len(data) != ref.size:
            raise UnusablePayloadError(
                Reason.CORRUPT, f"{ref.key}: {len(data)} bytes, not {ref.size}"
            )
        digest = content_hash(data, self._payload_key)
        if digest != ref.digest:
            raise UnusablePayloadError(Reason.CORRUPT, f"{ref.key}: content hash {digest[:12]}…")

    def decode(self, fragment: int, role: Role, data: bytes) -> F32:
        """A fresh flat fp32 buffer holding the payload's fragment."""
        wire = self.wire(fragment, role)
        bounds = self._bounds(fragment, role)
        try:
            file = unseal(data, self.config.compression, bounds.file, bounds.header)
            payload = read_payload(file, bounds.header)
        except PayloadError as error:
            raise UnusablePayloadError(Reason.CORRUPT, str(error)) from error
        try:
            codes, scales = read_fragment(payload, wire)
        except PayloadError as error:
            raise UnusablePayloadError(Reason.SCHEMA, str(error)) from error
        out = np.empty(wire.layout.total, dtype=np.float32)
        self._numpy.decode(codes, scales, wire, out)
        return out

    def load(self, fragment: int, role: Role, ref: PayloadRef, data: bytes | None) -> F32:
        """Check, decode and (for deltas) require finite values; raises UnusablePayloadError."""
        self.check(ref, data)
        assert data is not None
        x = self.decode(fragment, role, data)
        if role is Role.DELTA and not self._numpy.all_finite(x):
            raise UnusablePayloadError(Reason.NONFINITE, f"{ref.key} holds NaN or Inf")
        return x

    # -- the closer's arithmetic ----------------------------------------------------------

    def merge(
        self,
        fragment: int,
        theta: F32,
        momentum: F32 | None,
        deltas: Sequence[F32],
        contributions: Contributions,
    ) -> Merged:
        """New theta and momentum (fresh buffers) from the deltas the run's merge keeps."""
        cfg = self.config
        compute = self._compute
        layout = self.layouts[fragment]
        arrays = [compute.asarray(d) for d in deltas]
        plan = self._plan(arrays, contributions, layout)
        kept = [arrays[i] for i in plan.kept]
        final = tuple(contributions.final[i] for i in plan.kept) if contributions.final else ()
        merged_by = Contributions(
            learners=tuple(contributions.learners[i] for i in plan.kept),
            weights=plan.shares,
            final=final if any(final) else (),
            scales=plan.scales,
            trim=plan.trim,
        )
        new_theta = compute.asarray(theta.copy())
        new_momentum = compute.asarray(
            np.zeros_like(theta) if momentum is None else momentum.copy()
        )
        compute.merge_step(
            kept,
            merged_by,
            layout,
            plan.rule,
            cfg.embedding_pattern,
            new_theta,
            new_momentum,
            cfg.outer_lr,
            cfg.outer_momentum,
        )
        return Merged(
            theta=compute.to_numpy(new_theta),
            momentum=compute.to_numpy(new_momentum),
            cosine=compute.cosine(kept),
            outliers=tuple(contributions.learners[i] for i in plan.rejected),
        )

    def _plan(
        self, arrays: Sequence[Any], contributions: Contributions, layout: Layout
    ) -> MergePlan:
        """The run's merge of these deltas; screened by norm and cosine to their median first
        when the run asks for clipping or outlier rejection (the decision is gm_core's)."""
        shares = normalized_weights(contributions.weights)
        if not robust.screens(self.config):
            return robust.plan_merge(self.config, shares)
        trim = robust.trim_count(MergeRule.MEDIAN, len(arrays), 0.0)
        median = Contributions(learners=contributions.learners, weights=shares, trim=trim)
        centre = self._compute.empty(layout.total)
        rule = MergeRule.MEDIAN if trim else MergeRule.MEAN
        self._compute.merge(arrays, median, layout, rule, "", centre)
        norms, cosines = self._compute.spread(arrays, centre)
        return robust.plan_merge(self.config, shares, norms, cosines)


@attrs.frozen(kw_only=True)
class Merged:
    """A merge's outcome: new theta and momentum, the merged deltas' mean pairwise cosine,
    and the learners whose deltas were rejected as outliers (in contribution order)."""

    theta: F32
    momentum: F32
    cosine: float | None
    outliers: tuple[str, ...]


def compute_backend(name: str, *, torch_model: bool = True) -> Backend[Any]:
    """The merge backend. ``auto``: torch on the process's accelerator where it has one
    (CUDA, else Apple's MPS: merges and the outer step where the bytes are cheapest to
    move), else torch on CPU, where torch is installed; numpy where it is not, or where
    the session trains another framework's model (``torch_model`` False: an MLX or a JAX
    learner would import torch for its merges alone, seconds of CPU and hundreds of MB)."""
    from gm_shell.backends import backend

    if name != "auto":
        return backend(name)
    if not torch_model:
        return NumpyBackend()
    try:
        import torch
    except ImportError:
        return NumpyBackend()
    if torch.cuda.is_available():
        return backend("torch", device="cuda")
    if torch.backends.mps.is_available():
        return backend("torch", device="mps")
    return backend("torch")
