"""The closer's merge on its torch device equals the host path: payloads decoded and judged
there, merged and outer-stepped there, encoded there (issue 14, Build item 2).

With a torch compute backend a closer's deltas and momentum never take the numpy decoder
(:attr:`gm_shell.fragments.FragmentCodec.device`). These tests hold that path to the host
one on CPU torch: any payload bytes decode to the same bits and get the same verdict
(``nonfinite`` included), a merge from device-decoded inputs is bit for bit the merge the
same backend makes from host-decoded ones (and fp32-close to numpy's), and the encoded
theta and momentum are byte for byte the host encoder's. On a CUDA machine
``bench/device_check.sh`` runs them on the device too (the ``torch-cuda`` cases).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fragments import manifest, values

from gm_core.numerics import Contributions
from gm_core.records import Compression, MergeRule, PayloadRef, Reason, WireFormat
from gm_shell.backends import Backend, NumpyBackend, backend
from gm_shell.backends.torch_backend import TorchBackend
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.payload import PayloadWriter, byte_view, content_hash, seal, write_fragment

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
devices = pytest.mark.parametrize("device", DEVICES)
cases = settings(max_examples=40, deadline=None)


def codec_on(device: str, **config: Any) -> FragmentCodec:
    # Small blocks exercise the multi-block paths of the torch kernels on small fragments.
    return FragmentCodec(manifest(**config), TorchBackend(device=device, block=64, codec_block=64))


class Codes:
    """An "encoder" that writes given bytes as a fragment's codes and scales: payloads no
    correct node writes (NaN and Inf codes, any scale byte) reach a closer too."""

    def __init__(self, codes: bytes, scales: bytes) -> None:
        self.codes, self.scales = codes, scales

    def encode(self, x: Any, wire: Any, codes: np.ndarray, scales: np.ndarray) -> None:
        codes[:] = np.frombuffer(self.codes, np.uint8)[: codes.size]
        scales[:] = np.frombuffer(self.scales, np.uint8)[: scales.size]


def payload(codec: FragmentCodec, fragment: int, codes: Codes) -> tuple[bytes, PayloadRef]:
    """Sealed and hashed as a writer would, with ``codes`` as the fragment's contents."""
    wire = codec.wire(fragment, Role.DELTA)
    file = write_fragment(PayloadWriter(), codes, None, wire)  # type: ignore[arg-type]
    data = bytes(byte_view(seal(file, codec.config.compression)))
    digest = content_hash(data)
    return data, PayloadRef(key=f"payloads/000000000001/{digest}.st", size=len(data), digest=digest)


def loaded(codec: FragmentCodec, ref: PayloadRef, data: bytes, on: Backend[Any] | None) -> Any:
    """The decoded delta as host values, or the reason it was rejected."""
    try:
        x = codec.load(0, Role.DELTA, ref, data, on)
    except UnusablePayloadError as rejected:
        return rejected.reason
    return on.to_numpy(x) if on is not None else x


@devices
@cases
@given(
    st.sampled_from(list(WireFormat)),
    st.sampled_from(list(Compression)),
    st.binary(min_size=1024, max_size=1024),
)
def test_any_payload_decodes_and_is_judged_alike_on_the_device(
    device: str, fmt: WireFormat, compression: Compression, noise: bytes
) -> None:
    codec = codec_on(device, delta_format=fmt, commit_format=fmt, compression=compression)
    wire = codec.wire(0, Role.DELTA)
    repeat = -(-(wire.code_bytes + wire.scale_bytes) // len(noise))
    raw = noise * repeat
    data, ref = payload(codec, 0, Codes(raw[: wire.code_bytes], raw[wire.code_bytes :]))
    host, there = loaded(codec, ref, data, None), loaded(codec, ref, data, codec.compute)
    if isinstance(host, Reason):
        assert there is host
        return
    assert not isinstance(there, Reason), f"rejected {there} on the device only"
    # Same bits, up to the bits of NaNs (the verdict never sees those: a delta with a
    # NaN is rejected above, and a commit is not judged).
    np.testing.assert_array_equal(there, host)


@devices
@pytest.mark.parametrize("fmt", list(WireFormat))
def test_a_non_finite_delta_is_rejected_by_name_on_the_device(device: str, fmt: WireFormat) -> None:
    """Every delta format, quantized ones included: a NaN or Inf must not come out of fp8's
    or fp4's scaling as a large finite value (it did, ~2e36 and ~1.3e38, before the NaN
    scale byte of protocol §wire formats)."""
    codec = codec_on(device, delta_format=fmt, commit_format=fmt)
    for bad in (np.nan, np.inf, -np.inf):
        x = values(codec, 0)
        x[7] = bad
        data, ref = codec.encode(0, Role.DELTA, 1, x)
        for on in (None, codec.compute):
            with pytest.raises(UnusablePayloadError) as caught:
                codec.load(0, Role.DELTA, ref, data, on)
            assert caught.value.reason is Reason.NONFINITE
        theta = codec.load(0, Role.THETA, ref, data, codec.compute)  # a commit is not judged
        assert not np.isfinite(codec.compute.to_numpy(theta)[7])


def test_the_device_is_torch_on_an_accelerator_only() -> None:
    """On CPU the host path is faster (bench/README.md), so a CPU torch backend only merges."""
    assert isinstance(FragmentCodec(manifest()).device, NumpyBackend)
    assert isinstance(FragmentCodec(manifest(), backend("numpy")).device, NumpyBackend)
    assert isinstance(FragmentCodec(manifest(), backend("mlx")).device, NumpyBackend)
    assert isinstance(FragmentCodec(manifest(), backend("torch")).device, NumpyBackend)
    for device in DEVICES[1:]:
        torch_codec = FragmentCodec(manifest(), backend("torch", device=device))
        assert torch_codec.device is torch_codec.compute


@devices
def test_the_closer_merges_what_it_holds_on_the_device_or_the_host(device: str) -> None:
    """``merge_held``, the runtime's call, from what :meth:`load` gave with ``codec.device``:
    torch's buffers on an accelerator, host arrays on CPU (merged by torch there all the
    same): the bits of torch's merge either way, left where they were held."""
    codec = FragmentCodec(manifest(), TorchBackend(device=device, block=64, codec_block=64))
    held, compute = codec.device, codec.compute
    encoded = [codec.encode(0, Role.DELTA, 1, values(codec, 0, seed) * 0.01) for seed in (1, 2)]
    deltas = [codec.load(0, Role.DELTA, ref, data, held) for data, ref in encoded]
    who = Contributions(learners=("n0", "n1"), weights=(0.5, 0.5))
    theta = values(codec, 0)
    merged = codec.merge_held(0, theta, None, deltas, who)
    assert isinstance(merged.theta, np.ndarray) == (device == "cpu")
    there = [compute.asarray(held.to_numpy(x)) for x in deltas]
    expected = compute.to_numpy(codec.merge_on(compute, 0, theta, None, there, who).theta)
    np.testing.assert_array_equal(held.to_numpy(merged.theta), expected)


@devices
@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from([WireFormat.F32, WireFormat.BF16, WireFormat.F8_E4M3, WireFormat.F4_E2M1]),
    st.sampled_from([WireFormat.F32, WireFormat.BF16, WireFormat.F8_E4M3]),
    st.sampled_from(list(MergeRule)),
    st.integers(1, 4),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_the_device_merge_equals_the_host_merge(
    device: str,
    delta_format: WireFormat,
    commit_format: WireFormat,
    rule: MergeRule,
    k: int,
    screened: bool,
    seed: int,
) -> None:
    """From payload bytes to payload bytes, as ``Runtime._merge`` does it on each path."""
    config: dict[str, Any] = {
        "delta_format": delta_format,
        "commit_format": commit_format,
        "merge": rule,
        "outlier_cosine": 0.0 if screened else None,
    }
    codec = codec_on(device, **config)
    host = FragmentCodec(manifest(**config))  # numpy: the reference path
    dev = codec.compute  # the device path, called directly (on CPU the runtime takes the host's)
    rng = np.random.default_rng(seed)
    fragment = int(rng.integers(0, 2))
    theta = values(codec, fragment, seed)
    encoded = [
        codec.encode(fragment, Role.DELTA, 1, values(codec, fragment, seed + 1 + i) * 0.01)
        for i in range(k)
    ]
    m_data, m_ref = codec.encode(fragment, Role.MOMENTUM, 1, values(codec, fragment, seed + 9))
    who = Contributions(
        learners=tuple(f"n{i}" for i in range(k)),
        weights=tuple(float(w) for w in rng.dirichlet(np.ones(k))),
    )

    on_device = [codec.load(fragment, Role.DELTA, ref, data, dev) for data, ref in encoded]
    momentum = codec.load(fragment, Role.MOMENTUM, m_ref, m_data, dev)
    kept = [dev.to_numpy(x).copy() for x in (*on_device, momentum)]
    merged = codec.merge_on(dev, fragment, theta, momentum, on_device, who)
    # The inputs may be cached values: the merge never writes them.
    for before, after in zip(kept, (*on_device, momentum), strict=True):
        np.testing.assert_array_equal(dev.to_numpy(after), before)

    # The same backend from host-decoded inputs (the path before this change): same bits.
    deltas = [host.load(fragment, Role.DELTA, ref, data) for data, ref in encoded]
    before = codec.merge(
        fragment, theta, host.load(fragment, Role.MOMENTUM, m_ref, m_data), deltas, who
    )
    np.testing.assert_array_equal(dev.to_numpy(merged.theta), before.theta)
    np.testing.assert_array_equal(dev.to_numpy(merged.momentum), before.momentum)
    assert (merged.cosine, merged.outliers) == (before.cosine, before.outliers)
    # numpy's merge: within fp32 rounding (the torch kernels fuse multiply-adds).
    reference = host.merge(fragment, theta, kept[-1], deltas, who)
    np.testing.assert_allclose(dev.to_numpy(merged.theta), reference.theta, rtol=1e-5, atol=1e-6)
    assert merged.outliers == reference.outliers

    # Encoded on the device: byte for byte the host encoder's, and brought home once.
    for role, x in ((Role.THETA, merged.theta), (Role.MOMENTUM, merged.momentum)):
        data, ref = codec.encode(fragment, role, 2, x, dev)
        assert (data, ref) == codec.encode(fragment, role, 2, dev.to_numpy(x))
        home = codec.brought_home(fragment, role, x, data, dev)
        assert home.tobytes() == codec.roundtrip(fragment, role, dev.to_numpy(x), data).tobytes()
