"""Payload files: safetensors bytes, written into a reused buffer and read without copies.

Theory of operation
-------------------
Every tensor payload in the bucket is a safetensors file: an 8-byte little-endian
header length, a JSON header (padded with spaces to a multiple of 8, so the data
starts aligned) mapping each tensor name to dtype, shape and ``[begin, end)``
offsets, then the data. Any safetensors reader can open our payloads.

Writing: :class:`PayloadWriter` lays out the header once for a list of tensors and
hands out writable views of each tensor's bytes inside a buffer it keeps from
payload to payload; encoders write codes straight into the file. Reading:
:func:`read_payload` parses and validates the header and returns numpy views of
the caller's bytes — nothing is copied. Any mismatch between a tensor's declared
dtype and shape and its byte range is a :class:`PayloadError` naming the tensor.

A fragment payload holds the wire layout of :mod:`gm_core.numerics.quant`: the
codes of every tensor in layout order, then every scale tensor. Written by us, the
two regions are contiguous and decode zero-copy; a file laid out differently by
another writer still decodes, through one gathering copy.

Compression (``zstd``) byte-shuffles each tensor by its element size (so
exponent bytes form runs, see :mod:`gm_core.numerics.shuffle`) and compresses the
whole file as one zstd frame. Both ways stream: the planes go through the
compressor a small buffer at a time, and come out of the decompressor straight into
their places (:class:`Inflating`: the header first, judged before any data is
decompressed, then no byte more than it declares), so neither a shuffled copy nor
an inflated copy of a fragment is ever made (on a closer's merge of one big
fragment, each was a fragment's size of memory more). Hashing is blake3 over the
exact bytes uploaded. Hashing and (de)compression are CPU work for a worker thread:
they refuse to run on a thread with a running event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, cast

import attrs
import blake3
import numpy as np
import zstandard

from gm_core.numerics.arrays import F32, U8, check_flat
from gm_core.numerics.quant import SCALE_DTYPE, SCALE_SUFFIX, WireLayout
from gm_core.records import Compression, WireFormat
from gm_shell.backends.protocol import Backend

BytesLike = bytes | bytearray | memoryview | U8
"""Anything whose bytes a payload can be read from or written as."""

DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
}
"""Bits per element of the safetensors dtypes gm reads (F4 packs two per byte)."""

HEADER_LIMIT = 100_000_000
"""Largest header accepted, as in the safetensors format itself (readers of fragments
pass the far smaller bound their layout implies: :func:`header_limit`)."""


class PayloadError(ValueError):
    """Bytes that are not the payload they claim to be; the message names the tensor."""


class SchemaMismatchError(PayloadError):
    """A well-formed payload whose tensors are not the fragment's (another model or shape)."""


@attrs.frozen
class TensorEntry:
    """A tensor as declared in a header: name, safetensors dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the data; a dtype or shape that cannot be stored is a PayloadError."""
        bits = DTYPE_BITS.get(self.dtype)
        if bits is None:
            raise PayloadError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise PayloadError(f"tensor {self.name!r}: bad shape {list(self.shape)}")
        total_bits = math.prod(self.shape) * bits
        if total_bits % 8:
            raise PayloadError(
                f"tensor {self.name!r}: {self.dtype} {list(self.shape)} is not whole bytes"
            )
        return total_bits // 8


@attrs.frozen(eq=False)
class TensorView:
    """A tensor's bytes inside a payload, as a view of the payload's memory."""

    entry: TensorEntry
    start: int
    data: U8


@attrs.frozen(eq=False)
class Payload:
    """A parsed payload: its tensors in file order, and the header's metadata."""

    file: U8
    tensors: Mapping[str, TensorView]
    metadata: Mapping[str, str]
    data_start: int


def byte_view(data: BytesLike) -> memoryview:
    """A memoryview of ``data``'s bytes, without copying."""
    return data.data if isinstance(data, np.ndarray) else memoryview(data)


def off_event_loop(what: str) -> None:
    """Refuse CPU-heavy work on an event loop thread: it belongs in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what} must run in a worker thread (asyncio.to_thread), not on the loop")


# -- writing -----------------------------------------------------------------------------


def header_bytes(entries: Sequence[TensorEntry], metadata: Mapping[str, str]) -> bytes:
    """Length prefix and padded JSON header for ``entries`` stored back to back."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for entry in entries:
        assert entry.name not in header, f"duplicate tensor {entry.name!r}"
        size = entry.nbytes
        header[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


class PayloadWriter:
    """Builds payload files in one buffer reused across payloads (grown, never shrunk).

    Views handed out by :meth:`layout` stay valid until the next call to it.
    """

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)
        self._header_key: tuple[tuple[TensorEntry, ...], tuple[tuple[str, str], ...]] | None = None
        self._header = b""

    def layout(
        self, entries: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None
    ) -> tuple[U8, dict[str, U8]]:
        """Write the header; return the whole file and a writable view of each tensor."""
        key = (tuple(entries), tuple(sorted((metadata or {}).items())))
        if key != self._header_key:
            self._header_key, self._header = key, header_bytes(entries, metadata or {})
        size = len(self._header) + sum(entry.nbytes for entry in entries)
        if self._buffer.shape[0] < size:
            self._buffer = np.empty(size, dtype=np.uint8)
        file = self._buffer[:size]
        file[: len(self._header)] = np.frombuffer(self._header, dtype=np.uint8)
        views: dict[str, U8] = {}
        at = len(self._header)
        for entry in entries:
            views[entry.name] = file[at : at + entry.nbytes]
            at += entry.nbytes
        return file, views


# -- reading -----------------------------------------------------------------------------


def parse_header(file: U8, limit: int = HEADER_LIMIT) -> tuple[dict[str, Any], int]:
    """The header object and the offset where data starts.

    At most ``limit`` header bytes are parsed. Nesting is bounded by the parser: a
    document nested deeper than Python's recursion limit (a legitimate header nests
    three levels) is a PayloadError like any other bad header, never a RecursionError
    that a caller could take for a failed request.
    """
    if file.shape[0] < 8:
        raise PayloadError(f"payload of {file.shape[0]} bytes has no header")
    (length,) = struct.unpack("<Q", file[:8].tobytes())
    if length > limit:
        raise PayloadError(f"header of {length} bytes, over the {limit}-byte limit")
    if length > file.shape[0] - 8:
        raise PayloadError(f"header length {length} exceeds the payload")
    try:
        header = json.loads(file[8 : 8 + length].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PayloadError(f"header is not JSON: {error}") from error
    except RecursionError:
        raise PayloadError("header nests too deeply to be a safetensors header") from None
    if not isinstance(header, dict):
        raise PayloadError("header is not a JSON object")
    return header, 8 + length


def parse_entry(name: str, fields: Any) -> tuple[TensorEntry, int, int]:
    """One header entry, checked: its declared dtype and shape match its byte range."""
    if not isinstance(fields, dict) or set(fields) != {"dtype", "shape", "data_offsets"}:
        raise PayloadError(f"tensor {name!r}: header entry must have dtype, shape, data_offsets")
    shape, offsets = fields["shape"], fields["data_offsets"]
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
        raise PayloadError(f"tensor {name!r}: malformed shape or data_offsets")
    if not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets):
        raise PayloadError(f"tensor {name!r}: bad data_offsets {offsets}")
    entry = TensorEntry(name=name, dtype=str(fields["dtype"]), shape=tuple(shape))
    begin, end = offsets
    if end - begin != entry.nbytes:
        raise PayloadError(
            f"tensor {name!r}: {entry.dtype} {list(shape)} needs {entry.nbytes} bytes, "
            f"data_offsets give {end - begin}"
        )
    return entry, begin, end


@attrs.frozen
class FileLayout:
    """A header's tensors in file order, each with its ``[begin, end)`` data offsets (checked
    to lie back to back from the data's start), the data's size, and the metadata."""

    entries: list[tuple[TensorEntry, int, int]]
    size: int
    metadata: dict[str, str]


def parse_entries(header: dict[str, Any]) -> FileLayout:
    """The :class:`FileLayout` a parsed header declares."""
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise PayloadError("__metadata__ must map strings to strings")
    parsed = sorted(
        (parse_entry(name, fields) for name, fields in header.items() if name != "__metadata__"),
        key=lambda e: e[1],
    )
    position = 0
    for entry, begin, end in parsed:
        if begin != position:
            raise PayloadError(
                f"tensor {entry.name!r}: data starts at {begin}, expected {position}"
            )
        position = end
    return FileLayout(entries=parsed, size=position, metadata=metadata)


def read_payload(data: BytesLike, header_limit: int = HEADER_LIMIT) -> Payload:
    """Parse and validate a payload; tensor data are views of ``data`` (no copy)."""
    file = np.frombuffer(data, dtype=np.uint8)
    header, data_start = parse_header(file, header_limit)
    layout = parse_entries(header)
    tensors: dict[str, TensorView] = {}
    for entry, begin, end in layout.entries:
        if data_start + end > file.shape[0]:
            raise PayloadError(
                f"tensor {entry.name!r}: declared to end at byte {data_start + end}, past the"
                f" payload's {file.shape[0]}"
            )
        view = file[data_start + begin : data_start + end]
        tensors[entry.name] = TensorView(entry=entry, start=begin, data=view)
    if data_start + layout.size != file.shape[0]:
        raise PayloadError(
            f"{file.shape[0] - data_start - layout.size} bytes after the last tensor"
        )
    return Payload(file=file, tensors=tensors, metadata=layout.metadata, data_start=data_start)


# -- fragments ---------------------------------------------------------------------------


def fragment_entries(wire: WireLayout) -> list[TensorEntry]:
    """Payload tensors of a fragment in ``wire``'s format: all codes, then all scales."""
    codes = [
        TensorEntry(name=t.span.name, dtype=wire.code_dtype, shape=t.shape) for t in wire.tensors
    ]
    scales = [
        TensorEntry(
            name=t.span.name + SCALE_SUFFIX, dtype=SCALE_DTYPE, shape=(t.scales[1] - t.scales[0],)
        )
        for t in wire.tensors
        if t.scales[1] > t.scales[0]
    ]
    return codes + scales


def header_limit(entries: Sequence[TensorEntry]) -> int:
    """The largest header a reader of a payload of ``entries`` parses.

    Generous for other writers (another key order, spacing, a little metadata):
    twice the header this module writes, plus 64 KiB; far below what could cost a
    reader memory.
    """
    return 2 * len(header_bytes(entries, {})) + (64 << 10)


def file_limit(entries: Sequence[TensorEntry]) -> int:
    """The largest (uncompressed) payload file of ``entries``: its data, exactly, and a
    header of at most :func:`header_limit` bytes."""
    return header_limit(entries) + sum(entry.nbytes for entry in entries)


def fragment_regions(file: U8, wire: WireLayout) -> tuple[U8, U8]:
    """The codes and scales regions of a file laid out by :func:`fragment_entries`."""
    data_start = file.shape[0] - wire.code_bytes - wire.scale_bytes
    codes = file[data_start : data_start + wire.code_bytes]
    return codes, file[data_start + wire.code_bytes :]


def check_fragment(declared: Mapping[str, TensorEntry], wire: WireLayout) -> None:
    """Raise :class:`SchemaMismatchError` unless the tensors ``declared`` (by name) are exactly
    the fragment's in ``wire``'s format."""
    expected = fragment_entries(wire)
    names = {entry.name for entry in expected}
    for name in declared:
        if name not in names:
            raise SchemaMismatchError(f"tensor {name!r}: not in the fragment")
    for entry in expected:
        got = declared.get(entry.name)
        if got is None:
            raise SchemaMismatchError(f"tensor {entry.name!r}: missing from payload")
        if got != entry:
            raise SchemaMismatchError(
                f"tensor {entry.name!r}: payload has {got.dtype} {list(got.shape)}, "
                f"expected {entry.dtype} {list(entry.shape)}"
            )


def read_fragment(payload: Payload, wire: WireLayout) -> tuple[U8, U8]:
    """Codes and scales regions of a fragment payload, checked tensor by tensor.

    Zero-copy when the file stores the tensors in our order; otherwise gathered.
    """
    check_fragment({name: view.entry for name, view in payload.tensors.items()}, wire)
    views = [payload.tensors[entry.name] for entry in fragment_entries(wire)]
    starts = [view.start for view in views]
    if starts == sorted(starts):  # adjacent, since read_payload checked there are no gaps
        begin = payload.data_start + (starts[0] if starts else 0)
        joined = payload.file[begin : begin + wire.code_bytes + wire.scale_bytes]
    else:
        joined = np.concatenate([view.data for view in views])
    return joined[: wire.code_bytes], joined[wire.code_bytes :]


def write_fragment(
    writer: PayloadWriter,
    backend: Backend[Any],
    x: Any,
    wire: WireLayout,
    metadata: Mapping[str, str] | None = None,
) -> U8:
    """Encode the fragment ``x`` straight into ``writer``'s buffer; return the file bytes."""
    file, _ = writer.layout(fragment_entries(wire), metadata)
    codes, scales = fragment_regions(file, wire)
    backend.encode(x, wire, codes, scales)
    return file


# -- compression and hashing -------------------------------------------------------------


def sealed_limit(size: int, compression: Compression) -> int:
    """The most bytes a file of ``size`` bytes can take once sealed: itself, or the
    worst case of one zstd frame (libzstd's ``ZSTD_compressBound``, plus room for the
    frame header and checksum)."""
    if compression is Compression.NONE:
        return size
    small = ((128 << 10) - size) >> 11 if size < (128 << 10) else 0
    return size + (size >> 8) + small + 64


def plane_size(entry: TensorEntry) -> int:
    """Element size used for shuffling; sub-byte and byte dtypes are left as they are."""
    return max(DTYPE_BITS[entry.dtype] // 8, 1)


CHUNK = 1 << 18
"""Bytes a stream of shuffled planes goes through at a time (:func:`seal`, :func:`unseal`):
a buffer of this size, never a shuffled copy of the file."""

Sealed = bytes | memoryview
"""The bytes to upload: a fresh buffer, or a view of one (never of a buffer reused later)."""


def _pieces(parts: Sequence[tuple[U8, int]]) -> Iterator[U8]:
    """Views of ``parts`` (each: bytes, and the element size its planes are shuffled by)
    in the order :func:`shuffle` lays their bytes out, plane by plane, none longer than
    :data:`CHUNK`: what a frame streams, written or read in place."""
    for data, size in parts:
        elements = data.reshape(-1, size)
        for plane in range(size):
            for lo in range(0, elements.shape[0], CHUNK):
                yield elements[lo : lo + CHUNK, plane]


def _differences(a: F32, b: F32) -> Iterator[U8]:
    """The pieces :func:`_pieces` gives of ``a − b`` viewed as bytes (planes of 4), with
    no array of the difference: each piece's elements are subtracted into a scratch of
    :data:`CHUNK` values as it is asked for (once per plane, four times in all: ≈ 3 ms
    more for 16 MiB, against ≈ 60 ms of compression). A piece is a view of the scratch,
    valid until the next is asked for."""
    scratch = np.empty(min(CHUNK, a.shape[0]), dtype=np.float32)
    planes = scratch.view(np.uint8).reshape(-1, 4)
    for plane in range(4):
        for lo in range(0, a.shape[0], CHUNK):
            hi = min(lo + CHUNK, a.shape[0])
            np.subtract(a[lo:hi], b[lo:hi], out=scratch[: hi - lo])
            yield planes[: hi - lo, plane]


def _compressed(parts: Sequence[tuple[U8, int]], level: int) -> memoryview:
    """One zstd frame of ``parts`` laid end to end (:func:`_pieces`)."""
    return _compressed_pieces(_pieces(parts), sum(data.shape[0] for data, _ in parts), level)


def _compressed_pieces(pieces: Iterable[U8], total: int, level: int) -> memoryview:
    """One zstd frame of ``pieces`` (``total`` bytes), gathered a buffer of :data:`CHUNK`
    bytes at a time for the compressor (each piece is copied before the next is asked
    for), into one buffer of the frame's worst-case size (pages untouched by the frame
    stay unmapped)."""
    out = np.empty(sealed_limit(total, Compression.ZSTD), dtype=np.uint8)
    chunk = np.empty(min(CHUNK, total), dtype=np.uint8)
    compressor = zstandard.ZstdCompressor(level=level).compressobj(size=total)
    at = filled = 0

    def put(block: bytes) -> None:
        nonlocal at
        out[at : at + len(block)] = np.frombuffer(block, dtype=np.uint8)
        at += len(block)

    for piece in pieces:
        if filled + piece.shape[0] > chunk.shape[0]:
            put(compressor.compress(chunk[:filled].data))
            filled = 0
        chunk[filled : filled + piece.shape[0]] = piece
        filled += piece.shape[0]
    put(compressor.compress(chunk[:filled].data))
    put(compressor.flush())
    return out[:at].data


def seal(file: U8, compression: Compression, level: int = 3) -> memoryview:
    """The bytes to upload: the file itself (a view), or its shuffled zstd frame."""
    if compression is Compression.NONE:
        return file.data
    off_event_loop("payload compression")
    payload = read_payload(file)
    parts = [(file[: payload.data_start], 1)]
    parts += [(view.data, plane_size(view.entry)) for view in payload.tensors.values()]
    return _compressed(parts, level)


def seal_f32(
    x: Any, wire: WireLayout, compression: Compression, level: int = 3, minus: F32 | None = None
) -> Sealed:
    """``seal(write_fragment(writer, numpy, x, wire), compression)``, byte for byte, for an
    F32 ``wire``, without the file: the bytes of ``x`` are the codes, so they go straight
    into the result (a bare file: joined to the header; zstd: shuffled as they stream into
    the compressor), and no buffer of a fragment's size is made but the result.

    With ``minus``, the payload of ``x − minus`` (numpy's subtraction, element by element):
    in a zstd frame the difference is made a chunk at a time as it streams
    (:func:`_differences`), never whole; in a bare file it is made in its place there."""
    assert wire.format is WireFormat.F32, wire.format
    check_flat(x, wire.layout.total, "x")
    if minus is not None:
        check_flat(minus, wire.layout.total, "minus")
    header = header_bytes(fragment_entries(wire), {})
    if compression is Compression.NONE:
        return _bare_f32(header, x, minus)
    body = np.ascontiguousarray(x).view(np.uint8)
    off_event_loop("payload compression")
    head = np.frombuffer(header, dtype=np.uint8)
    if minus is None:
        parts = [(head, 1)] + [(body[t.codes[0] : t.codes[1]], 4) for t in wire.tensors]
        return _compressed(parts, level)
    pieces = itertools.chain(
        _pieces([(head, 1)]),
        *(_differences(x[t.span.start : t.span.stop], minus[t.span.start : t.span.stop])
          for t in wire.tensors),
    )  # fmt: skip
    return _compressed_pieces(pieces, head.shape[0] + 4 * wire.layout.total, level)


def _bare_f32(header: bytes, x: F32, minus: F32 | None) -> memoryview:
    """A bare file of ``header`` then the values of ``x`` (or ``x − minus``), written into
    one fresh buffer: no copy of the values, nor of their difference, is made beside it
    (the header's length is a multiple of 8: the values are aligned). Where ``x`` is the
    values of such a file with this header already (:func:`bare_file_of`: a closer's new
    theta made in its own delta's payload, its momentum kept in its last payload's bytes),
    that file is the result, no copy made: its caller writes ``x`` again only once these
    bytes are uploaded, and only where the store keeps no reference to them."""
    if minus is None:
        file_of_x = bare_file_of(x)
        if (
            file_of_x is not None
            and file_of_x.nbytes == len(header) + x.nbytes
            and file_of_x[: len(header)] == header
        ):
            return file_of_x
    file = np.empty(len(header) + 4 * x.shape[0], dtype=np.uint8)
    file[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    values = file[len(header) :].view(np.float32)
    if minus is None:
        values[:] = x
    else:
        np.subtract(x, minus, out=values)
    return file.data


def bare_values(data: Sealed, wire: WireLayout) -> F32:
    """The values of a bare F32 file :func:`seal_f32` made (a view of its bytes, no copy)."""
    assert wire.format is WireFormat.F32, wire.format
    size = 4 * wire.layout.total
    return np.frombuffer(data, dtype=np.float32, offset=len(data) - size)


def bare_file_of(x: Any) -> memoryview | None:
    """The bare file whose values ``x`` is, as :func:`bare_values` views them (``x`` ends
    where the file's bytes end), or None when ``x`` is not such a view."""
    base = getattr(x, "base", None)
    if not isinstance(x, np.ndarray) or not isinstance(base, memoryview):
        return None
    if x.dtype != np.float32 or x.ndim != 1 or base.ndim != 1 or base.itemsize != 1:
        return None
    start = np.frombuffer(base, dtype=np.uint8).ctypes.data
    return base if x.ctypes.data + x.nbytes == start + base.nbytes else None


READ_SIZE = 1 << 20
"""What a decompressor asks of its source at a time (zstandard's default is 128 KiB)."""

FRAME_HEADER_MAX = 18
"""The most bytes a zstd frame header takes (``ZSTD_FRAMEHEADERSIZE_MAX``)."""


class Received:
    """A payload's bytes as they arrive, a GET's body chunk by chunk: read like a file by
    the decoder, hashed on the way in, and refused past the size its reference declares.
    A decode that streams from it never holds the body whole (a fragment's compressed
    bytes, ≈ 0.85 of the decoded ones for f32), where a read of the body first did."""

    def __init__(self, chunks: Iterable[BytesLike], size: int, key: bytes | None) -> None:
        self._chunks = iter(chunks)
        self.size = size
        self.count = 0
        """The bytes received so far."""
        self._hasher = blake3.blake3(key=key) if key is not None else blake3.blake3()
        self._pending = memoryview(b"")

    def _take(self) -> memoryview | None:
        """The next chunk, counted, capped and hashed; None at the end."""
        chunk = next(self._chunks, None)
        if chunk is None:
            return None
        view = byte_view(chunk)
        self.count += len(view)
        if self.count > self.size:
            raise PayloadError(f"more than the {self.size} bytes its reference declares")
        self._hasher.update(view)
        return view

    def peek(self, n: int) -> memoryview:
        """The next ``n`` bytes (fewer at the end), left to be read."""
        while len(self._pending) < n and (view := self._take()) is not None:
            # joined only while the first chunks are shorter than n (bytes, not a body)
            self._pending = (
                memoryview(bytes(self._pending) + bytes(view)) if self._pending else view
            )
        return self._pending[:n]

    def read(self, n: int = -1) -> memoryview:
        """At most ``n`` bytes (a file's ``read``: empty at the end; ``n < 0``: the rest)."""
        if n < 0:
            return self.whole()
        if not self._pending:
            self._pending = self._take() or memoryview(b"")
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def drain(self) -> None:
        """Receive (and hash) whatever is left of the body, keeping none of it."""
        self._pending = memoryview(b"")
        while self._take() is not None:
            pass

    def whole(self) -> memoryview:
        """The rest of the body in one buffer (for decodes that do not stream)."""
        parts = [self._pending]
        while (view := self._take()) is not None:
            parts.append(view)
        self._pending = memoryview(b"")
        return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))

    def hexdigest(self) -> str:
        """The hash of every byte received (``content_hash``'s, once all are in)."""
        return str(self._hasher.hexdigest())


class Inflating:
    """A zstd frame's bytes, decompressed as they are read and never more than asked for:
    a frame that declares or makes more than the reader allows costs it nothing. The
    frame is a buffer, or bytes arriving (:class:`Received`)."""

    def __init__(self, data: BytesLike | Received, max_size: int) -> None:
        off_event_loop("payload decompression")
        frame = data if isinstance(data, Received) else byte_view(data)
        head = frame.peek(FRAME_HEADER_MAX) if isinstance(frame, Received) else frame
        try:
            declared = zstandard.frame_content_size(head)
        except zstandard.ZstdError as error:
            raise PayloadError(f"not a zstd frame: {error}") from error
        if declared > max_size:
            raise PayloadError(
                f"zstd frame declares {declared} bytes, over the {max_size}-byte limit"
            )
        self.declared = None if declared < 0 else declared  # -1: not declared
        self.max_size = max_size
        self.read = 0
        source = cast("IO[bytes]", frame)  # a buffer, or a Received: read() is all it takes
        # A Received is read a chunk at a time: each read is a call back into Python.
        self._reader = zstandard.ZstdDecompressor().stream_reader(source, read_size=READ_SIZE)

    def into(self, out: U8) -> None:
        """Fill ``out`` with the frame's next bytes (a PayloadError if it has fewer)."""
        if self.read + out.shape[0] > self.max_size:
            raise PayloadError(f"zstd frame does not decode within {self.max_size} bytes")
        filled = 0
        while filled < out.shape[0]:
            try:
                got = self._reader.readinto(out[filled:].data)
            except zstandard.ZstdError as error:
                raise PayloadError(f"zstd frame does not decode: {error}") from error
            if not got:
                raise PayloadError(f"zstd frame ends after {self.read + filled} bytes")
            filled += got
        self.read += filled

    def scatter(self, parts: Sequence[tuple[U8, int]]) -> None:
        """Fill ``parts`` (as :func:`_compressed` takes them) with the frame's next bytes,
        read a buffer of :data:`CHUNK` bytes at a time and put in place plane by plane:
        no copy of the whole is made."""
        left = sum(data.shape[0] for data, _ in parts)
        chunk = np.empty(min(CHUNK, left), dtype=np.uint8)
        at = have = 0
        for piece in _pieces(parts):
            done = 0
            while done < piece.shape[0]:
                if at == have:
                    have, at = min(chunk.shape[0], left), 0
                    self.into(chunk[:have])
                    left -= have
                n = min(piece.shape[0] - done, have - at)
                piece[done : done + n] = chunk[at : at + n]
                done, at = done + n, at + n

    def header(self, header_limit: int) -> tuple[U8, FileLayout]:
        """The file's length prefix and header (its bytes, and what it declares), read
        first; a file bigger than the reader allows, or than the frame says, is refused
        before any of its data is."""
        head = np.empty(8, dtype=np.uint8)
        self.into(head)
        (length,) = struct.unpack("<Q", head.tobytes())
        if length > header_limit:
            raise PayloadError(f"header of {length} bytes, over the {header_limit}-byte limit")
        head = np.concatenate([head, np.empty(length, dtype=np.uint8)])
        self.into(head[8:])
        header, data_start = parse_header(head, header_limit)
        layout = parse_entries(header)
        size = data_start + layout.size
        if size > self.max_size:
            last = layout.entries[-1][0].name
            raise PayloadError(
                f"tensor {last!r}: declared to end at byte {size}, past the"
                f" {self.max_size}-byte limit"
            )
        if self.declared is not None and self.declared != size:
            raise PayloadError(f"zstd frame declares {self.declared} bytes, its header {size}")
        return head, layout

    def end(self) -> None:
        """Raise a PayloadError unless the frame ends here (and nothing follows it)."""
        try:
            extra = self._reader.read(1)
        except zstandard.ZstdError as error:
            raise PayloadError(f"zstd frame does not decode: {error}") from error
        if extra:
            raise PayloadError(f"zstd frame does not decode to {self.read} bytes: more follow")


def unseal(
    data: BytesLike, compression: Compression, max_size: int, header_limit: int = HEADER_LIMIT
) -> U8:
    """Inverse of :func:`seal`, producing at most ``max_size`` bytes (the largest file the
    reader expects); a frame that declares or produces more, or does not decompress, is a
    PayloadError. Nothing larger than the file its header declares (at most ``max_size``)
    is ever allocated, and each tensor is unshuffled as it streams out of the frame."""
    if compression is Compression.NONE:
        file = np.frombuffer(data, dtype=np.uint8)
        if file.shape[0] > max_size:
            raise PayloadError(f"payload of {file.shape[0]} bytes, over the {max_size}-byte limit")
        return file
    frame = Inflating(data, max_size)
    head, layout = frame.header(header_limit)
    file = np.empty(head.shape[0] + layout.size, dtype=np.uint8)
    file[: head.shape[0]] = head
    at = head.shape[0]
    frame.scatter(
        [(file[at + begin : at + end], plane_size(e)) for e, begin, end in layout.entries]
    )
    frame.end()
    return file


def unseal_f32(
    data: BytesLike | Received, wire: WireLayout, max_size: int, header_limit: int, out: Any
) -> None:
    """Decode a zstd frame of an F32 ``wire`` into ``out``, as unsealing and reading the
    file would, with no file: each tensor streams out of the frame into its place in
    ``out``. A frame that is not such a file is a PayloadError, a file of other tensors a
    :class:`SchemaMismatchError` (found from its header, before any data is decompressed)."""
    assert wire.format is WireFormat.F32, wire.format
    check_flat(out, wire.layout.total, "out")
    frame = Inflating(data, max_size)
    _, layout = frame.header(header_limit)
    check_fragment({entry.name: entry for entry, _, _ in layout.entries}, wire)
    places = {t.span.name: t.codes for t in wire.tensors}
    target = out.view(np.uint8)
    frame.scatter([(target[slice(*places[entry.name])], 4) for entry, _, _ in layout.entries])
    frame.end()


def content_hash(data: BytesLike, key: bytes | None = None) -> str:
    """Hex blake3 of ``data`` (keyed with a 32-byte ``key`` for authentication).

    Runs at memory speed in the calling worker thread; refuses the event loop.
    """
    off_event_loop("payload hashing")
    hasher = blake3.blake3(key=key) if key is not None else blake3.blake3()
    hasher.update(byte_view(data))
    return str(hasher.hexdigest())
