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

Where the closer's payloads live (:attr:`FragmentCodec.device`). With a torch
compute backend on an accelerator (CUDA, MPS), a closer's deltas and momentum are
decoded by torch on the compute device (:meth:`FragmentCodec.load` with
``backend``), judged finite there, merged and outer-stepped there
(:meth:`FragmentCodec.merge_on`), and theta and momentum are encoded there
(:meth:`FragmentCodec.encode` with ``backend``): only the quantized codes cross to
the host, once each way, and the new theta is copied back once for the commit cache
a learner aligns from. Checking, decompressing and parsing a payload stay on the
host (bytes from the bucket). With numpy, MLX or torch on CPU,
:attr:`~FragmentCodec.device` is the host and every call is the host path (on CPU,
numpy's codecs beat torch's and there is no transfer to save); torch on CPU still
merges, from the host arrays it shares memory with. A learner's payloads (its deltas
out, its commits in) always take the host path: its model's copies go through
:mod:`gm_shell.staging` instead.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, cast, overload

import attrs
import numpy as np

from gm_core import keys, robust
from gm_core.auth import RunAuth
from gm_core.numerics import Contributions, Layout, WireLayout, wire_layout
from gm_core.numerics.arrays import F32
from gm_core.records import (
    AlgorithmConfig,
    Alignment,
    Compression,
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
    BytesLike,
    PayloadError,
    PayloadWriter,
    Received,
    SchemaMismatchError,
    Sealed,
    bare_values,
    content_hash,
    file_limit,
    fragment_entries,
    header_bytes,
    header_limit,
    read_fragment,
    read_payload,
    seal,
    seal_f32,
    sealed_limit,
    unseal,
    unseal_f32,
    write_fragment,
)
from gm_shell.spill import Spill, Spilled, write_values

A = TypeVar("A")


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
        self.device: Backend[Any] = self._compute if on_accelerator(self._compute) else self._numpy
        """Where a closer's payloads are decoded, merged and encoded: the torch compute
        backend where its device is an accelerator (CUDA, MPS), else the host (numpy). On
        CPU there are no transfers to save and numpy's codecs are faster than torch's
        (bench/README.md: fp4 1.9x, f32 1.5x slower on the device path), so a CPU torch
        backend merges host arrays (:meth:`merge`) as before issue 14; an MLX backend too."""
        self._local = threading.local()
        self._limits: dict[tuple[int, WireFormat], Bounds] = {}

    @property
    def compute(self) -> Backend[Any]:
        """The merge backend (torch, numpy or MLX), on whatever device it has."""
        return self._compute

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

    def encode(
        self,
        fragment: int,
        role: Role,
        round_: int,
        x: Any,
        backend: Backend[Any] | None = None,
        *,
        minus: F32 | None = None,
    ) -> tuple[Sealed, PayloadRef]:
        """The bytes to upload for ``x`` and the reference a record will carry; ``x`` is a
        host array, or one of ``backend``'s (its codes are then made on its device). With
        ``minus`` (host arrays both), those of ``x − minus``: where the wire is exact, made
        without a fragment-sized array of the difference (:func:`seal_f32`)."""
        wire = self.wire(fragment, role)
        on = backend or self._numpy
        if isinstance(on, NumpyBackend) and wire.format is WireFormat.F32:
            # Exact host values: their bytes are the codes, written once, into the result.
            data = seal_f32(x, wire, self.config.compression, minus=minus)
        else:
            if minus is not None:
                x = np.subtract(x, minus)
            writer: PayloadWriter | None = getattr(self._local, "writer", None)
            if writer is None:
                writer = self._local.writer = PayloadWriter()
            sealed = seal(write_fragment(writer, on, x, wire), self.config.compression)
            # A zstd frame is new bytes already; the bare file is the writer's reused buffer.
            data = bytes(sealed) if self.config.compression is Compression.NONE else sealed
        digest = content_hash(data, self._payload_key)
        ref = PayloadRef(key=keys.payload(round_, digest), size=len(data), digest=digest)
        return data, ref

    @overload
    def roundtrip(self, fragment: int, role: Role, x: F32, data: Sealed) -> F32: ...
    @overload
    def roundtrip(
        self, fragment: int, role: Role, x: A, data: Sealed, backend: Backend[A]
    ) -> A: ...
    def roundtrip(
        self, fragment: int, role: Role, x: Any, data: Sealed, backend: Backend[Any] | None = None
    ) -> Any:
        """What every reader of ``data`` will get: ``x`` itself when the format is exact;
        decoded by ``backend`` (default: numpy, on the host) when it is not."""
        if self._formats[role] is WireFormat.F32:
            return x
        return self._decode(backend or self._numpy, fragment, role, data)

    def brought_home(
        self, fragment: int, role: Role, x: A, data: Sealed, backend: Backend[A]
    ) -> F32:
        """What a host reader of ``data`` gets, for ``x`` on ``backend``'s device: ``x``
        copied back when the format is exact (a bare file's values viewed in ``data``: the
        bytes being uploaded are then all a host holds of them), else ``data`` decoded on
        the host."""
        if self.bare(role) and isinstance(data, memoryview):
            return bare_values(data, self.wire(fragment, role))
        if self._formats[role] is WireFormat.F32:
            return backend.to_numpy(x)
        return self.decode(fragment, role, data)

    # -- reading --------------------------------------------------------------------------

    def check(self, ref: PayloadRef, data: BytesLike | None) -> None:
        """Raise UnusablePayloadError unless ``data`` is exactly the bytes ``ref`` names."""
        if data is None:
            raise UnusablePayloadError(Reason.MISSING, f"{ref.key} is absent")
        _same_bytes(ref, len(data), lambda: content_hash(data, self._payload_key))

    def decode(self, fragment: int, role: Role, data: BytesLike) -> F32:
        """A fresh flat fp32 host buffer holding the payload's fragment."""
        decoded: F32 = self._decode(self._numpy, fragment, role, data)
        return decoded

    def _decode(self, backend: Backend[A], fragment: int, role: Role, data: BytesLike) -> A:
        """A fresh flat fp32 buffer of ``backend`` holding the payload's fragment: the
        bytes are unsealed and parsed on the host, the codes decoded by ``backend``."""
        wire = self.wire(fragment, role)
        bounds = self._bounds(fragment, role)
        host: Any = backend  # numpy's buffers are A here
        if (
            isinstance(host, NumpyBackend)
            and wire.format is WireFormat.F32
            and self.config.compression is Compression.ZSTD
        ):
            return cast(A, self._unshuffled(wire, bounds, data))
        try:
            file = unseal(data, self.config.compression, bounds.file, bounds.header)
            payload = read_payload(file, bounds.header)
        except PayloadError as error:
            raise UnusablePayloadError(Reason.CORRUPT, str(error)) from error
        try:
            codes, scales = read_fragment(payload, wire)
        except PayloadError as error:
            raise UnusablePayloadError(Reason.SCHEMA, str(error)) from error
        out = backend.empty(wire.layout.total)
        backend.decode(codes, scales, wire, out)
        return out

    def _unshuffled(self, wire: WireLayout, bounds: Bounds, data: BytesLike | Received) -> F32:
        """:meth:`_decode` of a zstd F32 payload on the host, each tensor unshuffled straight
        into the result as it streams out of the frame (no file); the same verdicts."""
        out = self._numpy.empty(wire.layout.total)
        try:
            unseal_f32(data, wire, bounds.file, bounds.header, out)
        except SchemaMismatchError as error:
            raise UnusablePayloadError(Reason.SCHEMA, str(error)) from error
        except PayloadError as error:
            raise UnusablePayloadError(Reason.CORRUPT, str(error)) from error
        return out

    @overload
    def load(self, fragment: int, role: Role, ref: PayloadRef, data: BytesLike | None) -> F32: ...
    @overload
    def load(
        self,
        fragment: int,
        role: Role,
        ref: PayloadRef,
        data: BytesLike | None,
        backend: Backend[A],
    ) -> A: ...
    def load(
        self,
        fragment: int,
        role: Role,
        ref: PayloadRef,
        data: BytesLike | None,
        backend: Backend[Any] | None = None,
    ) -> Any:
        """Check, decode and (for deltas) require finite values; raises UnusablePayloadError.

        Decoded by ``backend`` into a buffer on its device (default: numpy, the host), and
        judged finite there: the verdict is the same wherever the values are.
        """
        on = backend or self._numpy
        self.check(ref, data)
        assert data is not None
        x = self._decode(on, fragment, role, data)
        if role is Role.DELTA and not on.all_finite(x):
            raise UnusablePayloadError(Reason.NONFINITE, f"{ref.key} holds NaN or Inf")
        return x

    def bare(self, role: Role) -> bool:
        """Whether ``role``'s payloads are bare F32 files: their bytes are the values."""
        exact = self._formats[role] is WireFormat.F32
        return exact and self.config.compression is Compression.NONE

    def judged(
        self,
        fragment: int,
        role: Role,
        ref: PayloadRef,
        x: F32 | None,
        data: Sealed,
        backend: Backend[Any],
    ) -> Any:
        """:meth:`load` of ``data``, the bytes :meth:`encode` made of the host array ``x``
        (``ref``, theirs): where the format is exact they hold ``x``'s values, so ``x``
        itself goes to ``backend``'s device (shared where the framework allows), judged as
        a decode of them would be, with no decode and no second fragment-sized buffer. A
        bare file's bytes are the values: ``x`` may be None, they are viewed in ``data``."""
        if self._formats[role] is not WireFormat.F32:
            return self.load(fragment, role, ref, data, backend)
        if self.bare(role):
            x = bare_values(data, self.wire(fragment, role))
        assert x is not None, "an exact frame is judged from the values it was made of"
        held = backend.asarray(x)
        if role is Role.DELTA and not backend.all_finite(held):
            raise UnusablePayloadError(Reason.NONFINITE, f"{ref.key} holds NaN or Inf")
        return held

    def load_received(
        self,
        fragment: int,
        role: Role,
        ref: PayloadRef,
        chunks: Iterable[BytesLike],
        backend: Backend[Any] | None = None,
    ) -> Any:
        """:meth:`load` of a body as it arrives (``chunks``, a GET's body in order):
        decoded while it streams in where the
        decode streams (a zstd F32 payload on the host, the common case), else gathered
        whole first; either way judged as :meth:`load` judges it. The digest is known only
        once every byte is in, so the bytes are decoded before they are known to be the
        reference's (every decode here is bounded, whatever the bytes), and a wrong digest
        or size is ``corrupt`` whatever the decode said, as when it is checked first."""
        on = backend or self._numpy
        wire = self.wire(fragment, role)
        received = Received(chunks, ref.size, self._payload_key)
        streams = (
            isinstance(on, NumpyBackend)
            and wire.format is WireFormat.F32
            and self.config.compression is Compression.ZSTD
        )
        if not streams:
            return self.load(fragment, role, ref, received.whole(), on)
        try:
            x = self._unshuffled(wire, self._bounds(fragment, role), received)
        except UnusablePayloadError:
            self._received_whole(ref, received)
            raise
        self._received_whole(ref, received)
        if role is Role.DELTA and not on.all_finite(x):
            raise UnusablePayloadError(Reason.NONFINITE, f"{ref.key} holds NaN or Inf")
        return x

    def spills(self, fragment: int, role: Role, spill: Spill | None) -> bool:
        """Whether ``role``'s payloads of ``fragment`` are read into a spill file (as host
        values of a bare F32 file, of a fragment of :attr:`Spill.above` bytes or more)."""
        return (
            role is Role.DELTA
            and spill is not None
            and self.bare(role)
            and spill.applies(4 * self.size(fragment))
        )

    def spilled(
        self, fragment: int, role: Role, ref: PayloadRef, chunks: Iterable[BytesLike], spill: Spill
    ) -> Spilled | F32:
        """:meth:`load_received` of a bare F32 payload into a spill file (:mod:`gm_shell.spill`):
        its values are written to the file as they arrive, its digest judged once the last
        byte is in, then its values judged finite, read back. A body that does not begin
        with this fragment's own header, or declares another size, is not gm's bare file
        of it: it is read into memory and judged as :meth:`load` judges it."""
        wire = self.wire(fragment, role)
        header = self._bare_header(fragment, role)
        received = Received(chunks, ref.size, self._payload_key)
        try:
            if ref.size != len(header) + 4 * wire.layout.total or (
                received.peek(len(header)) != header
            ):
                return self.load(fragment, role, ref, received.whole())
            received.read(len(header))
            return self._spill_values(ref, received, wire.layout.total, spill)
        except PayloadError as error:  # a body longer than its reference declares
            raise UnusablePayloadError(Reason.CORRUPT, f"{ref.key}: {error}") from error

    def _spill_values(self, ref: PayloadRef, received: Received, n: int, spill: Spill) -> Spilled:
        """The rest of ``received`` (``n`` values) in a new spill file, judged: its digest,
        then its values finite. The file is closed unless it is returned."""
        file = spill.file()
        try:
            write_values(file, received.read)
            self._received_whole(ref, received)
            values = Spilled(file, n)
            if not values.all_finite():
                raise UnusablePayloadError(Reason.NONFINITE, f"{ref.key} holds NaN or Inf")
        except BaseException:
            file.close()
            raise
        return values

    def _bare_header(self, fragment: int, role: Role) -> bytes:
        """The header of the bare F32 files :meth:`encode` makes of ``fragment``'s values."""
        return header_bytes(fragment_entries(self.wire(fragment, role)), {})

    def _received_whole(self, ref: PayloadRef, received: Received) -> None:
        """Raise UnusablePayloadError unless the body received was exactly ``ref``'s bytes."""
        try:
            received.drain()
        except PayloadError as error:
            raise UnusablePayloadError(Reason.CORRUPT, f"{ref.key}: {error}") from error
        _same_bytes(ref, received.count, received.hexdigest)

    # -- the closer's arithmetic ----------------------------------------------------------

    def merge(
        self,
        fragment: int,
        theta: F32,
        momentum: F32 | None,
        deltas: Sequence[F32 | Spilled],
        contributions: Contributions,
        *,
        handed_over: bool = False,
        into: int | None = None,
    ) -> Merged[F32]:
        """New theta and momentum (host buffers) from the deltas the run's merge keeps,
        merged on the compute backend (``handed_over``, ``into``: see :meth:`merge_on`); by
        numpy where a delta is :class:`Spilled` (read by blocks, into numpy's buffers)."""
        spilled = any(isinstance(d, Spilled) for d in deltas)
        compute: Backend[Any] = self._numpy if spilled else self._compute
        arrays = [d if isinstance(d, Spilled) else compute.asarray(d) for d in deltas]
        base = None if momentum is None else compute.asarray(momentum)
        merged = self.merge_on(
            compute, fragment, theta, base, arrays, contributions,
            handed_over=handed_over, into=into,
        )  # fmt: skip
        return attrs.evolve(
            merged, theta=compute.to_numpy(merged.theta), momentum=compute.to_numpy(merged.momentum)
        )

    def merge_held(
        self,
        fragment: int,
        theta: F32,
        momentum: Any | None,
        deltas: Sequence[Any],
        contributions: Contributions,
        *,
        handed_over: bool = False,
        into: int | None = None,
    ) -> Merged[Any]:
        """The closer's merge of deltas and momentum as :meth:`load` with :attr:`device`
        gave them: on the accelerator (:meth:`merge_on`, buffers there), else host arrays
        merged by the compute backend (:meth:`merge`, host buffers)."""
        merged_by = (fragment, theta, momentum, deltas, contributions)
        if self.device is self._compute:
            return self.merge_on(self._compute, *merged_by, handed_over=handed_over, into=into)
        return self.merge(*merged_by, handed_over=handed_over, into=into)

    def merge_on(
        self,
        compute: Backend[A],
        fragment: int,
        theta: F32,
        momentum: A | None,
        deltas: Sequence[A],
        contributions: Contributions,
        *,
        handed_over: bool = False,
        into: int | None = None,
    ) -> Merged[A]:
        """New theta and momentum, buffers of ``compute`` (on its device), from
        ``compute``'s deltas and momentum and the host theta: nothing is copied back.
        ``deltas`` are read, never written (they may be cached), but for ``deltas[into]``:
        the caller's to overwrite, it becomes the new theta (its blocks merged before they
        are written), not a fragment-sized copy of theta beside the deltas. ``momentum`` is
        read, unless it is ``handed_over``: the caller holds no other reference to it (a
        closer takes it out of its cache first), and the new momentum is then made in its
        place. A round of final deltas only leaves the momentum as it was: the result's is
        then ``momentum`` itself, never copied."""
        cfg = self.config
        layout = self.layouts[fragment]
        arrays = deltas
        plan = self._plan(compute, arrays, contributions, layout)
        kept = [arrays[i] for i in plan.kept]
        final = tuple(contributions.final[i] for i in plan.kept) if contributions.final else ()
        merged_by = Contributions(
            learners=tuple(contributions.learners[i] for i in plan.kept),
            weights=plan.shares,
            final=final if any(final) else (),
            scales=plan.scales,
            trim=plan.trim,
        )
        base = compute.asarray(theta)
        new_theta = compute.empty(layout.total) if into is None else arrays[into]
        cosine = compute.cosine(kept)  # before the merge: it may write into a delta
        if momentum is None:
            new_momentum = compute.asarray(np.zeros_like(theta))
        elif handed_over or merged_by.all_final:  # a final-only round leaves it unread
            new_momentum = momentum
        else:
            new_momentum = _copy(compute, momentum, layout.total)
        compute.merge_step(
            kept,
            merged_by,
            layout,
            plan.rule,
            cfg.embedding_pattern,
            base,
            new_momentum,
            cfg.outer_lr,
            cfg.outer_momentum,
            out=new_theta,
        )
        return Merged(
            theta=new_theta,
            momentum=new_momentum,
            cosine=cosine,
            outliers=tuple(contributions.learners[i] for i in plan.rejected),
        )

    def _plan(
        self,
        compute: Backend[A],
        arrays: Sequence[A],
        contributions: Contributions,
        layout: Layout,
    ) -> MergePlan:
        """The run's merge of these deltas; screened by norm and cosine to their median first
        when the run asks for clipping or outlier rejection (the decision is gm_core's)."""
        shares = normalized_weights(contributions.weights)
        if not robust.screens(self.config):
            return robust.plan_merge(self.config, shares)
        trim = robust.trim_count(MergeRule.MEDIAN, len(arrays), 0.0)
        median = Contributions(learners=contributions.learners, weights=shares, trim=trim)
        centre = compute.empty(layout.total)
        rule = MergeRule.MEDIAN if trim else MergeRule.MEAN
        compute.merge(arrays, median, layout, rule, "", centre)
        norms, cosines = compute.spread(arrays, centre)
        return robust.plan_merge(self.config, shares, norms, cosines)


def _same_bytes(ref: PayloadRef, size: int, digest: Callable[[], str]) -> None:
    """Raise UnusablePayloadError (``corrupt``) unless ``size`` bytes whose hash is
    ``digest()`` are the bytes ``ref`` names (the hash is taken only at the right size)."""
    if size != ref.size:
        raise UnusablePayloadError(Reason.CORRUPT, f"{ref.key}: {size} bytes, not {ref.size}")
    found = digest()
    if found != ref.digest:
        raise UnusablePayloadError(Reason.CORRUPT, f"{ref.key}: content hash {found[:12]}…")


def _copy(compute: Backend[A], x: A, n: int) -> A:
    """A fresh buffer of ``compute`` holding ``x`` (an overwrite is a copy on its device):
    ``x`` may share memory with a cached value, which the merge must not change."""
    out = compute.empty(n)
    compute.align(out, x, Alignment.OVERWRITE)
    return out


@attrs.frozen(kw_only=True)
class Merged(Generic[A]):
    """A merge's outcome: new theta and momentum (host arrays, or a compute backend's), the
    merged deltas' mean pairwise cosine, and the learners whose deltas were rejected as
    outliers (in contribution order)."""

    theta: A
    momentum: A
    cosine: float | None
    outliers: tuple[str, ...]


def on_accelerator(compute: Backend[Any]) -> bool:
    """Whether ``compute`` is torch on a device other than the CPU (numpy and MLX have none
    of their own: MLX's arrays are the host's memory)."""
    device = getattr(compute, "device", None)
    return compute.name == "torch" and device is not None and device.type != "cpu"


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
