"""Fragment payloads: every wire format and compression round trips; bad bytes are named."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import plan
from gm_core.numerics import Contributions, merge_step
from gm_core.records import (
    AlgorithmConfig,
    Compression,
    Manifest,
    MergeRule,
    PayloadRef,
    Reason,
    TensorSpec,
    WireFormat,
)
from gm_shell.backends import backend
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.payload import content_hash
from gm_shell.runtime import spare

SCHEMA = (
    TensorSpec(name="a.weight", shape=(33, 5), dtype="F32"),
    TensorSpec(name="a.bias", shape=(33,), dtype="F32"),
    TensorSpec(name="b.weight", shape=(7, 33), dtype="F32"),
)


def manifest(**config: object) -> Manifest:
    cfg = AlgorithmConfig(sync_every=8, fragments=2, **config)  # type: ignore[arg-type]
    return Manifest(
        run_id="r",
        created_by="n0",
        config=cfg,
        schema=SCHEMA,
        plan=plan.make_plan(SCHEMA, cfg),
        init=(),
    )


def values(codec: FragmentCodec, fragment: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=codec.size(fragment)).astype(np.float32)


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("fmt", list(WireFormat))
def test_every_format_round_trips_to_what_the_reference_decodes(
    fmt: WireFormat, compression: Compression
) -> None:
    codec = FragmentCodec(manifest(delta_format=fmt, commit_format=fmt, compression=compression))
    for fragment in range(2):
        x = values(codec, fragment)
        data, ref = codec.encode(fragment, Role.DELTA, 5, x)
        assert ref.key.startswith("payloads/000000000005/")
        assert ref.size == len(data)
        y = codec.load(fragment, Role.DELTA, ref, data)
        assert codec.roundtrip(fragment, Role.THETA, x, data).tobytes() == y.tobytes()
        if fmt is WireFormat.F32:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=0.5, atol=0.5)  # quantized, never wild


@pytest.mark.parametrize("name", ["numpy", "torch"])
@pytest.mark.parametrize("fmt", [WireFormat.F32, WireFormat.BF16])
@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD])
def test_a_delta_judged_from_its_own_encode_is_what_a_load_of_its_bytes_gives(
    name: str, fmt: WireFormat, compression: Compression
) -> None:
    """A closer-learner's own delta (``judged``: no decode where the wire is exact) gets
    the values and the verdict a ``load`` of its bytes gets, on the closer's device: in a
    bare F32 file those bytes themselves (no ``x`` needed), in a zstd frame ``x``."""
    device = backend(name)
    codec = FragmentCodec(manifest(delta_format=fmt, compression=compression), device)
    x = values(codec, 0)
    x[:5] = -0.0
    data, ref = codec.encode(0, Role.DELTA, 1, x)
    judged = device.to_numpy(codec.judged(0, Role.DELTA, ref, x, data, device))
    loaded = device.to_numpy(codec.load(0, Role.DELTA, ref, data, device))
    assert judged.tobytes() == loaded.tobytes()
    bare = codec.bare(Role.DELTA)
    assert bare is (fmt is WireFormat.F32 and compression is Compression.NONE)
    source = np.frombuffer(data, dtype=np.uint8) if bare else x
    assert np.shares_memory(judged, source) is (fmt is WireFormat.F32)  # no second buffer
    if bare:
        alone = device.to_numpy(codec.judged(0, Role.DELTA, ref, None, data, device))
        assert alone.tobytes() == loaded.tobytes()
    x[7] = np.inf
    data, ref = codec.encode(0, Role.DELTA, 1, x)
    with pytest.raises(UnusablePayloadError) as caught:
        codec.judged(0, Role.DELTA, ref, x, data, device)
    assert caught.value.reason is Reason.NONFINITE


def test_bad_bytes_are_rejected_with_the_protocols_reason() -> None:
    codec = FragmentCodec(manifest())
    x = values(codec, 0)
    data, ref = codec.encode(0, Role.DELTA, 1, x)

    def reason(ref: PayloadRef, data: bytes | None, role: Role = Role.DELTA) -> Reason:
        with pytest.raises(UnusablePayloadError) as caught:
            codec.load(0, role, ref, data)
        return caught.value.reason

    assert reason(ref, None) is Reason.MISSING
    assert reason(ref, data[:-1]) is Reason.CORRUPT
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert reason(ref, bytes(flipped)) is Reason.CORRUPT
    garbage, garbage_ref = _sealed(codec, b"not a safetensors file at all")
    assert reason(garbage_ref, garbage) is Reason.CORRUPT
    other, other_ref = FragmentCodec(manifest()).encode(1, Role.DELTA, 1, values(codec, 1))
    assert reason(other_ref, other) is Reason.SCHEMA  # fragment 1's tensors, read as fragment 0
    nan, nan_ref = codec.encode(0, Role.DELTA, 1, np.full_like(x, np.nan))
    assert reason(nan_ref, nan) is Reason.NONFINITE
    assert np.isnan(codec.load(0, Role.THETA, nan_ref, nan)).all()  # a commit is not judged


def _sealed(codec: FragmentCodec, data: bytes) -> tuple[bytes, PayloadRef]:
    from gm_shell.payload import content_hash

    digest = content_hash(data)
    return data, PayloadRef(key=f"payloads/000000000001/{digest}.st", size=len(data), digest=digest)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_merge_on_any_backend_matches_the_reference(name: str) -> None:
    codec = FragmentCodec(manifest(), backend(name))
    theta, momentum = values(codec, 0, 1), values(codec, 0, 2)
    deltas = [values(codec, 0, s) for s in (3, 4, 5)]
    contributions = Contributions(learners=("a", "b", "c"), weights=(0.5, 0.25, 0.25))
    merged = codec.merge(0, theta, momentum, deltas, contributions)
    new_theta, new_momentum, cosine = merged.theta, merged.momentum, merged.cosine
    assert merged.outliers == ()
    want_theta, want_momentum = theta.copy(), momentum.copy()
    cfg = codec.config
    merge_step(
        deltas, contributions, codec.layouts[0], cfg.merge, cfg.embedding_pattern,
        want_theta, want_momentum, cfg.outer_lr, cfg.outer_momentum,
    )  # fmt: skip
    np.testing.assert_allclose(new_theta, want_theta, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new_momentum, want_momentum, rtol=1e-6, atol=1e-6)
    assert cosine is not None
    assert -1.0 <= cosine <= 1.0
    assert not np.shares_memory(new_theta, theta)  # the cached base is never changed
    assert not np.shares_memory(new_momentum, momentum)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_a_momentum_handed_over_becomes_the_new_one_in_place(name: str) -> None:
    """The closer's merge (its momentum taken out of its cache) makes the new momentum
    where the old one was, with the values of a merge from a copy; a round of final deltas
    only leaves it as it was, and makes no copy of it, handed over or not."""
    codec = FragmentCodec(manifest(), backend(name))
    theta, momentum = values(codec, 0, 1), values(codec, 0, 2)
    deltas = [values(codec, 0, s) for s in (3, 4)]
    contributions = Contributions(learners=("a", "b"), weights=(0.5, 0.5))
    copied = codec.merge(0, theta, momentum, deltas, contributions)
    old = momentum.copy()
    owned = codec.merge(0, theta, momentum, deltas, contributions, handed_over=True)
    assert np.shares_memory(owned.momentum, momentum)
    np.testing.assert_array_equal(owned.momentum, copied.momentum)
    np.testing.assert_array_equal(owned.theta, copied.theta)
    assert not np.array_equal(momentum, old)
    final = attrs.evolve(contributions, final=(True, True))
    kept = momentum.copy()
    ended = codec.merge(0, theta, momentum, deltas, final, handed_over=True)
    np.testing.assert_array_equal(ended.momentum, kept)
    np.testing.assert_array_equal(momentum, kept)
    unowned = codec.merge(0, theta, momentum, deltas, final)  # not handed over: not copied
    assert np.shares_memory(unowned.momentum, momentum)
    np.testing.assert_array_equal(momentum, kept)


@pytest.mark.parametrize("name", ["numpy", "torch"])
@pytest.mark.parametrize("screened", [False, True], ids=["mean", "screened"])
def test_a_merge_into_a_delta_makes_the_new_theta_there(name: str, screened: bool) -> None:
    """A merge ``into`` one of its deltas (the closer's own to overwrite) gives the new
    theta, momentum, cosine and outliers of a merge into a fresh buffer, bit for bit, and
    the new theta is that delta's memory: no buffer is made for it. A screened-out
    delta (an outlier) may hold it too."""
    screens = {"outlier_norm_factor": 3.0, "merge": MergeRule.MEDIAN} if screened else {}
    codec = FragmentCodec(manifest(**screens), backend(name))
    theta, momentum = values(codec, 0, 1), values(codec, 0, 2)
    deltas = [values(codec, 0, s) for s in (3, 4, 5)]
    deltas[2] *= 100.0 if screened else 1.0
    contributions = Contributions(learners=("a", "b", "c"), weights=(0.5, 0.25, 0.25))
    fresh = codec.merge(0, theta, momentum, deltas, contributions)
    for into in range(3):
        copies = [d.copy() for d in deltas]
        merged = codec.merge(0, theta, momentum, copies, contributions, into=into)
        assert np.shares_memory(merged.theta, copies[into])
        assert merged.theta.tobytes() == fresh.theta.tobytes()
        assert merged.momentum.tobytes() == fresh.momentum.tobytes()
        assert (merged.cosine, merged.outliers) == (fresh.cosine, fresh.outliers)
    assert fresh.outliers == (("c",) if screened else ())


def test_a_merge_is_made_into_a_buffer_only_the_merge_holds() -> None:
    """:func:`spare` names a buffer held by the list alone and owning its memory: not one
    held elsewhere too, not a view of a payload's bytes (a store may hold those), not a
    tensor over numpy's memory."""
    held = np.zeros(4, np.float32)
    assert spare([held]) is None  # ``held`` refers to it too
    assert spare([held, np.zeros(4, np.float32)]) == 1
    view = np.frombuffer(np.zeros(16, np.uint8).data, dtype=np.float32)
    assert spare([view]) is None
    assert spare([torch.from_numpy(np.zeros(4, np.float32))]) is None
    assert spare([torch.from_numpy(np.zeros(4, np.float32)), torch.zeros(4)]) == 1
    assert spare([torch.zeros(8)[2:]]) is None  # a view of a tensor: its base is memory too


@pytest.mark.parametrize("name", ["numpy", "torch", "mlx"])
@pytest.mark.parametrize("attack", [100.0, -1.0])
def test_a_screened_merge_leaves_out_a_scaled_or_flipped_delta(name: str, attack: float) -> None:
    """With outlier screens on, 1 wild delta of 4 is named and the rest merged by the rule."""
    codec = FragmentCodec(
        manifest(merge=MergeRule.MEDIAN, outlier_norm_factor=3.0, outlier_cosine=0.0),
        backend(name),
    )
    theta, momentum = values(codec, 0, 1), values(codec, 0, 2)
    shared = values(codec, 0, 3)
    honest = [shared + 0.5 * values(codec, 0, s) for s in (4, 5, 6)]
    deltas = [*honest[:2], attack * honest[2], honest[2]]  # "c" is the wild one
    contributions = Contributions(learners=("a", "b", "c", "d"), weights=(1.0,) * 4)
    merged = codec.merge(0, theta, momentum, deltas, contributions)
    assert merged.outliers == ("c",)
    want_theta, want_momentum = theta.copy(), momentum.copy()
    kept = Contributions(learners=("a", "b", "d"), weights=(1.0,) * 3, trim=1)
    cfg = codec.config
    merge_step(
        [honest[0], honest[1], honest[2]], kept, codec.layouts[0], MergeRule.MEDIAN, "",
        want_theta, want_momentum, cfg.outer_lr, cfg.outer_momentum,
    )  # fmt: skip
    np.testing.assert_allclose(merged.theta, want_theta, rtol=1e-5, atol=1e-5)


def test_clipping_bounds_a_scaled_delta_to_the_median_norm() -> None:
    codec = FragmentCodec(manifest(clip_norm_factor=1.0, outer_momentum=0.0, outer_lr=1.0))
    theta = np.zeros(codec.size(0), np.float32)
    honest = [values(codec, 0, s) for s in (4, 5, 6)]
    contributions = Contributions(learners=("a", "b", "c", "d"), weights=(1.0,) * 4)
    merged = codec.merge(0, theta, None, [*honest, 100.0 * honest[0]], contributions)
    assert merged.outliers == ()
    norms = sorted(float(np.linalg.norm(d)) for d in [*honest, 100.0 * honest[0]])
    bound = (norms[1] + norms[2]) / 2  # the median norm, times a factor of 1
    # theta - 1.0 * mean of clipped deltas: the wild one counts with the median's length.
    assert float(np.linalg.norm(merged.theta)) <= (sum(norms[:3]) + bound) / 4 * (1 + 1e-5)
    assert float(np.linalg.norm(merged.theta)) > 0.0


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_two_learners_one_scaled_and_lying_moves_the_commit_a_bounded_step(name: str) -> None:
    """The 2-learner gap (gm_core.robust.counts_equally, protocol §11.3): of two deltas, one
    honest and one x100 whose learner claims nearly all the tokens. No rule can outvote it;
    under the median with clipping the two count equally and the wild one is clipped to
    ``clip_norm_factor`` times the honest norm: the commit moves 1.5 honest steps
    (factor 2), where the plain mean follows the liar 100 steps."""
    honest = values(FragmentCodec(manifest()), 0, 4)
    theta = np.zeros_like(honest)
    deltas = [honest, 100.0 * honest]
    contributions = Contributions(learners=("a", "evil"), weights=(1e-12, 1.0))
    moved = {}
    for rule, clip in ((MergeRule.MEAN, None), (MergeRule.MEDIAN, 2.0)):
        cfg = manifest(merge=rule, clip_norm_factor=clip, outer_momentum=0.0, outer_lr=1.0)
        merged = FragmentCodec(cfg, backend(name)).merge(0, theta, None, deltas, contributions)
        assert merged.outliers == ()  # two deltas are never screened: no majority
        moved[rule] = float(np.linalg.norm(merged.theta)) / float(np.linalg.norm(honest))
    assert moved[MergeRule.MEAN] > 99.0
    assert moved[MergeRule.MEDIAN] == pytest.approx(1.5, rel=1e-4)


SPOILS = ["sound", "flip", "cut", "longer", "garbage", "nan", "other digest"]
"""How :func:`spoiled` may spoil a payload."""


def spoiled(codec: FragmentCodec, role: Role, spoil: str, seed: int) -> tuple[bytes, PayloadRef]:
    """A payload of fragment 0 spoiled as ``spoil`` names (one of :data:`SPOILS`), and the
    reference a reader is given for it: sound, altered, cut, extended or foreign bytes
    (their reference names them), a non-finite value, or sound bytes under another digest."""
    rng = np.random.default_rng(seed)
    x = values(codec, 0, seed)
    if spoil == "nan":
        x[rng.integers(x.shape[0])] = np.nan
    data, ref = codec.encode(0, role, 3, x)
    body = bytearray(data)
    if spoil == "flip":
        body[rng.integers(len(body))] ^= 1 << int(rng.integers(8))
    elif spoil == "cut":
        body = body[: int(rng.integers(len(body)))]
    elif spoil == "longer":
        body += b"\0" * int(rng.integers(1, 64))
    elif spoil == "garbage":
        body = bytearray(rng.integers(0, 256, len(body), dtype=np.uint8).tobytes())
    if spoil in ("flip", "cut", "longer", "garbage"):  # a reference that names these bytes
        ref = attrs.evolve(ref, size=len(body), digest=content_hash(bytes(body)))
    if spoil == "other digest":
        ref = attrs.evolve(ref, digest=content_hash(b"other"))
    return bytes(body), ref


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except UnusablePayloadError as error:
        return "verdict", error.reason


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(list(Compression)),
    st.sampled_from([Role.DELTA, Role.THETA]),
    st.sampled_from(SPOILS),
    st.integers(1, 1 << 16),
    st.integers(0, 2**32 - 1),
)
def test_a_body_decoded_as_it_arrives_is_judged_as_the_whole_body_is(
    compression: Compression, role: Role, spoil: str, chunk: int, seed: int
) -> None:
    """``load_received`` (a GET's body in chunks of any size, decoded as it streams in where
    the format streams: zstd F32 on the host) gives what ``load`` of the whole body gives:
    the same values, or the same named verdict, for sound, altered, cut, extended or
    foreign bytes, and for a sound body under another reference's digest."""
    codec = FragmentCodec(manifest(compression=compression))
    body, ref = spoiled(codec, role, spoil, seed)
    chunks = [bytes(body[i : i + chunk]) for i in range(0, len(body), chunk)]
    whole = _outcome(lambda: codec.load(0, role, ref, bytes(body)))
    streamed = _outcome(lambda: codec.load_received(0, role, ref, iter(chunks)))
    assert whole[0] == streamed[0], (whole, streamed)
    if whole[0] == "value":
        np.testing.assert_array_equal(whole[1], streamed[1])
    else:
        assert whole[1] == streamed[1]


class _CutError(Exception):
    """A body's failure midway (the mailbox's stream error, here any exception)."""


def test_a_body_that_fails_midway_gets_no_verdict() -> None:
    """A stream that fails while a payload decodes from it raises its own error through the
    decoder (the mailbox retries the request): it is never judged ``corrupt`` (a verdict the
    reader would remember for the object's ETag)."""
    codec = FragmentCodec(manifest(compression=Compression.ZSTD))
    data, ref = codec.encode(0, Role.DELTA, 3, values(codec, 0))

    def chunks() -> Iterator[bytes]:
        yield bytes(data[: len(data) // 2])
        raise _CutError

    with pytest.raises(_CutError):
        codec.load_received(0, Role.DELTA, ref, chunks())
