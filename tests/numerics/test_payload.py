"""Payload files: safetensors interop, zero-copy reads, errors naming the tensor, sealing, hash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct

import blake3
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import fragment, layouts, seeds

from gm_core.numerics import Layout, shuffle, wire_layout
from gm_core.numerics.quant import WireLayout
from gm_core.records import Compression, WireFormat
from gm_shell.backends import NumpyBackend
from gm_shell.payload import (
    CHUNK,
    DTYPE_BITS,
    PayloadError,
    PayloadWriter,
    SchemaMismatchError,
    TensorEntry,
    bare_values,
    content_hash,
    fragment_entries,
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

NUMPY = NumpyBackend()


def decode_fragment(file: bytes | np.ndarray, wire: WireLayout, out: np.ndarray) -> None:
    """An uncompressed fragment payload read and decoded into ``out`` by the parts
    :class:`gm_shell.fragments.FragmentCodec` reads one with."""
    payload = read_payload(file, header_limit(fragment_entries(wire)))
    codes, scales = read_fragment(payload, wire)
    NUMPY.decode(codes, scales, wire, out)


def with_header(file: np.ndarray, edit: dict[str, object]) -> bytes:
    """``file`` with its header entries updated by ``edit`` (length prefix rewritten)."""
    (length,) = struct.unpack("<Q", file[:8].tobytes())
    header = json.loads(file[8 : 8 + length].tobytes())
    header.update(edit)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + file[8 + length :].tobytes()


@settings(max_examples=40, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(WireFormat)), st.sampled_from(list(Compression)))
def test_fragment_round_trip_through_sealed_bytes(
    layout: Layout, seed: int, fmt: WireFormat, compression: Compression
) -> None:
    x = fragment(np.random.default_rng(seed), layout.total)
    wire = wire_layout(layout, fmt)
    file = write_fragment(PayloadWriter(), NUMPY, x, wire, {"format": fmt.value})
    sent = bytes(seal(file, compression))
    received = unseal(sent, compression, file.shape[0])
    np.testing.assert_array_equal(received, file)
    direct, through = np.empty_like(x), np.empty_like(x)
    codes, scales = np.empty(wire.code_bytes, np.uint8), np.empty(wire.scale_bytes, np.uint8)
    NUMPY.encode(x, wire, codes, scales)
    NUMPY.decode(codes, scales, wire, direct)
    decode_fragment(received, wire, through)
    np.testing.assert_array_equal(through, direct)


@settings(max_examples=40, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(Compression)))
def test_f32_payloads_sealed_and_read_without_the_file_are_the_same_bytes(
    layout: Layout, seed: int, compression: Compression
) -> None:
    """seal_f32 writes byte for byte what the writer's file sealed is (so digests and keys
    do not change), and unseal_f32 decodes a zstd frame straight to ``x``."""
    x = fragment(np.random.default_rng(seed), layout.total)
    wire = wire_layout(layout, WireFormat.F32)
    file = write_fragment(PayloadWriter(), NUMPY, x, wire)
    sent = seal_f32(x, wire, compression)
    assert bytes(sent) == bytes(seal(file, compression))
    if compression is Compression.NONE:
        return  # nothing shuffled: read as before (decode_fragment)
    out = np.full_like(x, np.nan)
    unseal_f32(sent, wire, file.shape[0], 1 << 16, out)
    np.testing.assert_array_equal(out.view(np.uint32), x.view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(WireFormat)))
def test_a_zstd_payload_is_one_frame_of_the_file_with_each_tensor_shuffled(
    layout: Layout, seed: int, fmt: WireFormat
) -> None:
    """What seal streams through the compressor is the file as :func:`shuffle` defines the
    wire (each tensor's bytes in planes of its element size), whatever a plain zstd
    decoder reads it with; and what unseal streams out is the file again."""
    x = fragment(np.random.default_rng(seed), layout.total)
    file = write_fragment(PayloadWriter(), NUMPY, x, wire_layout(layout, fmt))
    sent = seal(file, Compression.ZSTD)
    expected = file.copy()
    payload = read_payload(file)
    for view in payload.tensors.values():
        at = payload.data_start + view.start
        size = max(DTYPE_BITS[view.entry.dtype] // 8, 1)
        shuffle(view.data, size, expected[at : at + view.data.shape[0]])
    assert zstandard.ZstdDecompressor().decompress(sent) == expected.tobytes()
    assert zstandard.frame_content_size(sent) == file.shape[0]
    assert unseal(sent, Compression.ZSTD, file.shape[0]).tobytes() == file.tobytes()


@settings(max_examples=40, deadline=None)
@given(
    st.one_of(layouts(), st.builds(lambda n: Layout.of([("w", (n,)), ("b", (3,))]),
                                   st.integers(CHUNK - 2, 2 * CHUNK + 5))),
    seeds(),
    st.sampled_from(list(Compression)),
)  # fmt: skip
def test_a_difference_sealed_as_it_streams_is_the_same_bytes_as_sealed_whole(
    layout: Layout, seed: int, compression: Compression
) -> None:
    """``seal_f32(a, minus=b)`` (a learner's ``anchor − θ``, never made whole) is byte for
    byte ``seal_f32(a − b)``, tensors longer than a chunk, signed zeros and non-finite
    differences included: the same digest, key and decode."""
    rng = np.random.default_rng(seed)
    a, b = fragment(rng, layout.total), fragment(rng, layout.total)
    b[rng.random(layout.total) < 0.05] = np.inf  # inf - inf: NaN; finite - inf: -inf
    a[rng.random(layout.total) < 0.05] = np.inf
    a[: layout.total // 3] = b[: layout.total // 3]  # exact zeros, +0.0 (x - x)
    wire = wire_layout(layout, WireFormat.F32)
    with np.errstate(invalid="ignore"):
        difference = np.subtract(a, b)
        whole = bytes(seal_f32(difference, wire, compression))
        sealed = seal_f32(a, wire, compression, minus=b)
    assert bytes(sealed) == whole
    if compression is Compression.NONE:  # a bare file: its values are viewed in it, no copy
        values = bare_values(sealed, wire)
        assert values.tobytes() == difference.tobytes()
        assert np.shares_memory(values, np.frombuffer(sealed, dtype=np.uint8))


def test_an_f32_frame_of_other_tensors_is_a_schema_mismatch_read_from_its_header() -> None:
    x = np.arange(11, dtype=np.float32)
    mine = wire_layout(Layout.of([("a", (2, 3)), ("b", (5,))]), WireFormat.F32)
    other = wire_layout(Layout.of([("a", (2, 3)), ("c", (5,))]), WireFormat.F32)
    sent = seal_f32(x, other, Compression.ZSTD)
    with pytest.raises(SchemaMismatchError, match="tensor 'c': not in the fragment"):
        unseal_f32(sent, mine, 1 << 16, 1 << 16, np.empty(11, np.float32))
    truncated = bytes(sent)[:-8]
    with pytest.raises(PayloadError, match="zstd") as raised:
        unseal_f32(truncated, mine, 1 << 16, 1 << 16, np.empty(11, np.float32))
    assert not isinstance(raised.value, SchemaMismatchError)


def test_the_safetensors_library_reads_our_files() -> None:
    layout = Layout.of([("a", (2, 3)), ("b", (5,))])
    x = np.arange(11, dtype=np.float32)
    file = write_fragment(PayloadWriter(), NUMPY, x, wire_layout(layout, WireFormat.F32))
    loaded = safetensors.numpy.load(file.tobytes())
    np.testing.assert_array_equal(loaded["a"], x[:6].reshape(2, 3))
    f4 = write_fragment(PayloadWriter(), NUMPY, x, wire_layout(layout, WireFormat.F4_E2M1))
    described = {
        name: (info["dtype"], info["shape"]) for name, info in safetensors.deserialize(f4.tobytes())
    }
    assert described == {
        "a": ("F4", [6]),
        "b": ("F4", [6]),
        "a:scale": ("F8_E8M0", [1]),
        "b:scale": ("F8_E8M0", [1]),
    }


def test_we_read_the_library_files_in_any_order() -> None:
    """The library orders tensors its own way: our reader gathers them (one copy)."""
    layout = Layout.of([("z", (3,)), ("a", (2,))])
    x = np.array([1, 2, 3, 4, 5], np.float32)
    data = safetensors.numpy.save({"z": x[:3], "a": x[3:]})
    out = np.empty(5, np.float32)
    decode_fragment(data, wire_layout(layout, WireFormat.F32), out)
    np.testing.assert_array_equal(out, x)


def test_reading_is_zero_copy_and_writing_reuses_the_buffer() -> None:
    layout = Layout.of([("a", (64,)), ("b", (40,))])
    wire = wire_layout(layout, WireFormat.F8_E4M3)
    writer = PayloadWriter()
    first = write_fragment(writer, NUMPY, np.ones(104, np.float32), wire)
    second = write_fragment(writer, NUMPY, np.full(104, 2.0, np.float32), wire)
    assert np.shares_memory(first, second)
    codes, scales = read_fragment(read_payload(second), wire)
    assert np.shares_memory(codes, second)
    assert np.shares_memory(scales, second)


def test_writer_views_address_each_tensor() -> None:
    entries = [
        TensorEntry(name="x", dtype="U8", shape=(3,)),
        TensorEntry(name="y", dtype="F32", shape=(1,)),
    ]
    file, views = PayloadWriter().layout(entries, {"note": "hi"})
    views["x"][:] = [1, 2, 3]
    views["y"].view(np.float32)[0] = 1.5
    payload = read_payload(file)
    assert payload.metadata == {"note": "hi"}
    assert payload.tensors["x"].data.tolist() == [1, 2, 3]
    assert payload.tensors["y"].data.view(np.float32)[0] == 1.5
    assert (payload.data_start % 8, len(payload.tensors)) == (0, 2)


@pytest.fixture
def f32_file() -> np.ndarray:
    layout = Layout.of([("a", (2, 3)), ("b", (5,))])
    return write_fragment(
        PayloadWriter(), NUMPY, np.zeros(11, np.float32), wire_layout(layout, WireFormat.F32)
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"b": {"dtype": "F32", "shape": [6], "data_offsets": [24, 44]}},
            "tensor 'b': F32 \\[6\\] needs 24 bytes",
        ),
        (
            {"b": {"dtype": "F64", "shape": [5], "data_offsets": [24, 44]}},
            "tensor 'b': F64 \\[5\\] needs 40",
        ),
        (
            {"b": {"dtype": "Q7", "shape": [5], "data_offsets": [24, 44]}},
            "tensor 'b': unknown dtype",
        ),
        (
            {"b": {"dtype": "F4", "shape": [5], "data_offsets": [24, 44]}},
            "tensor 'b': .* not whole bytes",
        ),
        ({"b": {"dtype": "F32", "shape": [-5], "data_offsets": [24, 44]}}, "tensor 'b': bad shape"),
        (
            {"b": {"dtype": "F32", "shape": [4], "data_offsets": [28, 44]}},
            "tensor 'b': data starts at 28",
        ),
        ({"b": {"dtype": "F32", "shape": [5]}}, "tensor 'b': header entry"),
    ],
)
def test_mismatched_bytes_name_the_tensor(
    f32_file: np.ndarray, edit: dict[str, object], message: str
) -> None:
    with pytest.raises(PayloadError, match=message):
        read_payload(with_header(f32_file, edit))


def test_fragment_mismatches_name_the_tensor(f32_file: np.ndarray) -> None:
    layout = Layout.of([("a", (2, 3)), ("b", (5,))])
    with pytest.raises(PayloadError, match="tensor 'a': payload has F32 \\[2, 3\\], expected BF16"):
        read_fragment(read_payload(f32_file), wire_layout(layout, WireFormat.BF16))
    other = Layout.of([("a", (2, 3)), ("c", (5,))])
    with pytest.raises(PayloadError, match="tensor 'b': not in the fragment"):
        read_fragment(read_payload(f32_file), wire_layout(other, WireFormat.F32))
    bigger = Layout.of([("a", (2, 3)), ("b", (5,)), ("c", (1,))])
    with pytest.raises(PayloadError, match="tensor 'c': missing"):
        read_fragment(read_payload(f32_file), wire_layout(bigger, WireFormat.F32))


def test_truncated_and_garbage_payloads(f32_file: np.ndarray) -> None:
    with pytest.raises(PayloadError, match="no header"):
        read_payload(b"abc")
    with pytest.raises(PayloadError, match="exceeds"):
        read_payload(f32_file[:40].tobytes())
    with pytest.raises(PayloadError, match="past the payload's"):
        read_payload(f32_file[:-4].tobytes())
    with pytest.raises(PayloadError, match="after the last tensor"):
        read_payload(f32_file.tobytes() + bytes(4))
    with pytest.raises(PayloadError, match="not JSON"):
        read_payload(struct.pack("<Q", 8) + b"{{{{{{{{")
    with pytest.raises(PayloadError, match="zstd"):
        unseal(b"\x28\xb5\x2f\xfd garbage", Compression.ZSTD, 1 << 20)


def test_content_hash_is_blake3_and_stays_off_the_event_loop() -> None:
    data = np.arange(1000, dtype=np.uint8)
    assert content_hash(data) == blake3.blake3(data.tobytes()).hexdigest()
    key = bytes(range(32))
    assert content_hash(b"x", key=key) == blake3.blake3(b"x", key=key).hexdigest()

    async def on_loop() -> None:
        with pytest.raises(RuntimeError, match="worker thread"):
            content_hash(b"x")
        assert await asyncio.to_thread(content_hash, b"x") == blake3.blake3(b"x").hexdigest()

    asyncio.run(on_loop())


def test_shuffled_zstd_shrinks_smooth_fp32_data() -> None:
    layout = Layout.of([("w", (4096,))])
    x = (1.0 + np.arange(4096, dtype=np.float32) * 1e-4).astype(np.float32)
    file = write_fragment(PayloadWriter(), NUMPY, x, wire_layout(layout, WireFormat.F32))
    assert len(bytes(seal(file, Compression.ZSTD))) < 0.5 * file.shape[0]


def test_reads_are_bounded_by_what_the_reader_expects(f32_file: np.ndarray) -> None:
    """Sizes, decompressed sizes and nesting are judged before memory is spent on them."""
    size = f32_file.shape[0]
    with pytest.raises(PayloadError, match="over the 8-byte limit"):
        read_payload(f32_file.tobytes(), header_limit=8)
    with pytest.raises(PayloadError, match="nests too deeply"):
        read_payload(struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(PayloadError, match=f"over the {size - 1}-byte limit"):
        unseal(f32_file.tobytes(), Compression.NONE, size - 1)
    frame = seal(f32_file, Compression.ZSTD)
    assert unseal(frame, Compression.ZSTD, size).tobytes() == f32_file.tobytes()
    with pytest.raises(PayloadError, match=f"declares {size} bytes, over the {size - 1}-byte"):
        unseal(frame, Compression.ZSTD, size - 1)
    undeclared = zstandard.ZstdCompressor(write_content_size=False)
    with pytest.raises(PayloadError, match=f"past the {size - 1}-byte limit"):
        unseal(undeclared.compress(f32_file.tobytes()), Compression.ZSTD, size - 1)
    bomb = undeclared.compressobj()  # the file, then 64 MiB of zeros: never inflated
    head = bomb.compress(f32_file.tobytes())
    tail = [bomb.compress(bytes(1 << 20)) for _ in range(64)]
    inflating = head + b"".join(tail) + bomb.flush()
    with pytest.raises(PayloadError, match=f"does not decode to {size} bytes: more follow"):
        unseal(inflating, Compression.ZSTD, size)
    with pytest.raises(PayloadError, match="does not decode within 20 bytes"):
        unseal(undeclared.compress(f32_file.tobytes()), Compression.ZSTD, 20)  # header too
    with pytest.raises(PayloadError, match="does not decode"):  # a second frame after it
        unseal(bytes(frame) + bytes(frame), Compression.ZSTD, 2 * size)
    assert len(bytes(frame)) <= sealed_limit(size, Compression.ZSTD)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1 << 20), st.integers(0, 2**32))
def test_no_zstd_frame_is_bigger_than_the_sealed_limit(size: int, seed: int) -> None:
    """Incompressible bytes are the worst case zstd can meet."""
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    assert len(frame) <= sealed_limit(size, Compression.ZSTD)


@settings(max_examples=200, deadline=None)
@given(
    layouts(),
    seeds(),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), min_size=1, max_size=4),
    st.integers(0, 64),
)
def test_a_damaged_frame_is_refused_as_a_payload_error_or_read_within_its_bounds(
    layout: Layout, seed: int, flips: list[tuple[int, int]], cut: int
) -> None:
    """Any bytes flipped in a sealed F32 payload, or any cut off its end: the streamed
    readers either refuse it as a :class:`PayloadError` (a schema mismatch among them) or
    read a file of at most the size allowed — nothing else is ever raised or allocated."""
    x = fragment(np.random.default_rng(seed), layout.total)
    wire = wire_layout(layout, WireFormat.F32)
    size = write_fragment(PayloadWriter(), NUMPY, x, wire).shape[0]
    damaged = bytearray(seal_f32(x, wire, Compression.ZSTD))
    for at, mask in flips:
        damaged[at % len(damaged)] ^= mask
    data = bytes(damaged[: len(damaged) - min(cut, len(damaged) - 1)])
    with contextlib.suppress(PayloadError):
        assert unseal(data, Compression.ZSTD, size).shape[0] <= size
    out = np.empty_like(x)
    with contextlib.suppress(PayloadError):
        unseal_f32(data, wire, size, 1 << 16, out)
