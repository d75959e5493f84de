"""Spilled deltas (:mod:`gm_shell.spill`): judged as a load judges the same bytes, merged as
their arrays merge, bit for bit; and the closer's zero-copy payloads around them."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fragments import SPOILS, _outcome, manifest, spoiled, values

from gm_core.numerics import Contributions, Layout, merge_step
from gm_core.numerics.blocks import BLOCK
from gm_core.numerics.merge import mean_pairwise_cosine
from gm_core.numerics.robust import spread_by
from gm_core.records import Compression, MergeRule, Reason
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.backends import NumpyBackend
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.mailbox import RANGE_CHUNK, Mailbox
from gm_shell.payload import bare_file_of, bare_values, content_hash, seal_f32
from gm_shell.runtime import spare
from gm_shell.spill import Spill, Spilled

SPILL = Spill(above=0)
FAST = SessionOptions(poll_s=0.02, renew_s=0.3, close_timeout_s=5.0, stall_timeout_s=60.0)


def spilled(x: np.ndarray) -> Spilled:
    """``x``'s values in a spill file of their own."""
    file = tempfile.TemporaryFile()  # noqa: SIM115 (the Spilled closes it)
    file.write(x.tobytes())
    file.flush()
    return Spilled(file, x.shape[0])


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, BLOCK + 300), min_size=1, max_size=3),
    st.integers(2, 4),
    st.sampled_from(list(MergeRule)),
    st.booleans(),
    st.data(),
)
def test_a_spilled_delta_merges_as_its_array_does(
    sizes: list[int], k: int, rule: MergeRule, final: bool, data: st.DataObject
) -> None:
    """The fused step, the cosine and the screen's spread read a spilled delta by blocks and
    give what they give of its array, bit for bit: every rule (RDA on the tensors the
    pattern leaves, trimmed means), final rounds, fragments of one block or several, any
    of the deltas spilled, the new theta made in an array delta or beside them."""
    layout = Layout.of((f"t{i}" if i else "embed", (n,)) for i, n in enumerate(sizes))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n = layout.total
    deltas = [rng.normal(size=n).astype(np.float32) for _ in range(k)]
    robust = rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN)
    c = Contributions(
        learners=tuple(f"l{i}" for i in range(k)),
        weights=tuple(float(w) for w in rng.uniform(0.1, 1.0, k)),
        final=(final,) * k,
        trim=int(robust and k >= 3),
    )
    spill = data.draw(st.lists(st.booleans(), min_size=k, max_size=k))
    mixed: list[Any] = [spilled(d) if s else d.copy() for d, s in zip(deltas, spill, strict=True)]
    arrays = [i for i, s in enumerate(spill) if not s]
    into = data.draw(st.sampled_from([None, *arrays]))
    theta, momentum = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    expected_theta, expected_momentum = theta.copy(), momentum.copy()
    merge_step(deltas, c, layout, rule, "embed", expected_theta, expected_momentum, 0.7, 0.9)
    got_momentum = momentum.copy()
    out = None if into is None else mixed[into]
    merge_step(mixed, c, layout, rule, "embed", theta, got_momentum, 0.7, 0.9, out=out)
    got_theta = theta if out is None else out
    assert got_theta.tobytes() == expected_theta.tobytes()
    assert got_momentum.tobytes() == expected_momentum.tobytes()
    fresh = [spilled(d) if s else d for d, s in zip(deltas, spill, strict=True)]
    assert mean_pairwise_cosine(fresh) == mean_pairwise_cosine(deltas)
    centre = deltas[0]
    assert spread_by(fresh, centre, np.dot, n) == spread_by(deltas, centre, np.dot, n)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(SPOILS),
    st.integers(1, 1 << 16),
    st.integers(0, 2**32 - 1),
)
def test_a_spilled_body_is_judged_as_the_whole_body_is(spoil: str, chunk: int, seed: int) -> None:
    """``spilled`` (a GET's body, in chunks of any size, written to a file as it arrives)
    gives what ``load`` of the whole body gives: the same values, read back from the file,
    or the same named verdict, for sound, altered, cut, extended or foreign bytes, a
    non-finite value, and a sound body under another reference's digest."""
    codec = FragmentCodec(manifest())
    body, ref = spoiled(codec, Role.DELTA, spoil, seed)
    chunks = [bytes(body[i : i + chunk]) for i in range(0, len(body), chunk)]
    whole = _outcome(lambda: codec.load(0, Role.DELTA, ref, bytes(body)))
    streamed = _outcome(lambda: codec.spilled(0, Role.DELTA, ref, iter(chunks), SPILL))
    assert whole[0] == streamed[0], (whole, streamed)
    if whole[0] == "verdict":
        assert whole[1] == streamed[1]
        return
    value = streamed[1]
    assert isinstance(value, Spilled)  # gm's own bare file: to disk
    assert value[0 : value.shape[0]].tobytes() == whole[1].tobytes()


def test_only_big_bare_deltas_spill_and_a_full_disk_keeps_them_in_memory() -> None:
    """Deltas spill from :attr:`Spill.above` bytes, in the bare format only; a directory
    without twice the delta's bytes free keeps it in memory (never a failed read)."""
    bare, packed = FragmentCodec(manifest()), FragmentCodec(manifest(compression="zstd"))
    size = 4 * bare.size(0)
    assert bare.spills(0, Role.DELTA, Spill(above=size))
    assert not bare.spills(0, Role.DELTA, Spill(above=size + 1))
    assert not bare.spills(0, Role.THETA, SPILL)
    assert not packed.spills(0, Role.DELTA, SPILL)
    assert not bare.spills(0, Role.DELTA, None)
    assert not Spill(above=0).applies(1 << 62)  # no disk has twice that free


def test_a_foreign_body_is_read_into_memory_and_judged() -> None:
    """A body that is not this fragment's bare file (zstd here) is judged as ``load``
    judges it, in memory: a sound one is its values, not a spill file."""
    codec = FragmentCodec(manifest(compression=Compression.ZSTD))
    x = values(codec, 0)
    data, ref = codec.encode(0, Role.DELTA, 1, x)
    got = codec.spilled(0, Role.DELTA, ref, iter([bytes(data)]), SPILL)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, x)
    bad = attrs.evolve(ref, digest=content_hash(b"x"))
    assert _outcome(lambda: codec.spilled(0, Role.DELTA, bad, iter([bytes(data)]), SPILL)) == (
        "verdict",
        Reason.CORRUPT,
    )


def test_a_bare_payloads_values_are_sealed_as_the_payload_itself() -> None:
    """The values of a bare F32 file, viewed in it, seal to that very file (no copy): a new
    theta made in a delta's payload, a momentum kept in its payload. Not so a difference,
    a view of another header's file, nor of a longer buffer's tail."""
    codec = FragmentCodec(manifest())
    wire = codec.wire(0, Role.THETA)
    x = values(codec, 0)
    data = seal_f32(x, wire, Compression.NONE)
    assert isinstance(data, memoryview)
    view = bare_values(data, wire)
    assert address(bare_file_of(view)) == address(data)
    view *= 2.0  # a merge writes the new values there
    again = seal_f32(view, wire, Compression.NONE)
    assert address(again) == address(data)
    assert codec.load(0, Role.THETA, _ref(again), again).tobytes() == (2 * x).tobytes()
    assert address(seal_f32(view, wire, Compression.NONE, minus=x)) != address(data)
    longer = np.zeros(len(data) + 8, np.uint8)
    longer[8:] = np.frombuffer(data, np.uint8)
    tail = bare_values(longer.data, wire)
    assert bare_file_of(tail) is not None
    sealed = seal_f32(tail, wire, Compression.NONE)
    assert address(sealed) != address(longer.data)
    assert bytes(sealed) == bytes(data)


def address(buffer: Any) -> int:
    """Where a buffer's first byte is in memory."""
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


def _ref(data: Any) -> Any:
    from gm_core.records import PayloadRef

    return PayloadRef(key="payloads/000000000001/x", size=len(data), digest=content_hash(data))


def test_a_merge_writes_into_its_own_payloads_values_only_where_no_one_else_holds_them() -> None:
    """With ``uploads`` (the node's uploaded bytes are its own again), :func:`spare` names a
    learner's own delta viewed in its bare payload when the list alone holds the view and
    it is the whole tail of the payload's bytes; never a spilled delta, never without
    ``uploads`` (a memory store holds the very bytes it was given)."""
    codec = FragmentCodec(manifest())
    wire = codec.wire(0, Role.DELTA)

    def own() -> np.ndarray:
        return bare_values(seal_f32(values(codec, 0), wire, Compression.NONE), wire)

    assert spare([own()]) is None
    assert spare([own()], uploads=True) == 0
    view = own()
    assert spare([view], uploads=True) is None  # ``view`` refers to it too
    assert spare([view.view()], uploads=True) is None  # a view of the view: not the file's
    assert spare([view[1:]], uploads=True) is None  # not the file's whole tail
    assert spare([spilled(values(codec, 0))], uploads=True) is None
    assert spare([spilled(values(codec, 0)), own()], uploads=True) == 1


@pytest.mark.parametrize("n", [1, BLOCK, BLOCK + 1])
def test_a_spilled_delta_reads_any_span_and_judges_finiteness(n: int) -> None:
    """Slices of any length and place read the values written, longer than a block too;
    a value that is not finite anywhere is found."""
    x = np.arange(n, dtype=np.float32)
    s = spilled(x)
    assert (s.shape, s.nbytes) == ((n,), 4 * n)
    assert s.all_finite()
    for lo, hi in [(0, n), (n // 2, n), (n - 1, n), (0, 0)]:
        np.testing.assert_array_equal(s[lo:hi], x[lo:hi])
    x[-1] = np.inf
    assert not spilled(x).all_finite()


@pytest.mark.parametrize("store", ["file", "memory"])
def test_a_closer_merges_spilled_deltas_into_its_own_payload_and_seals_it_as_it_is(
    store: str, tmp_path: Path
) -> None:
    """A real run: a closer-learner (spilling every delta) and a learner, quorum 2. Each
    merge reads the learner's delta from a spill file, bit for bit the merge of the same
    deltas held as arrays. On ``file://`` it makes the new theta in the closer-learner's
    own delta's payload, and that payload is sealed as the new theta's as it is; from the
    second merge on, the momentum's payload is the momentum itself. A memory store holds
    the very bytes it was given: there, neither payload is written again (the learner
    aligns with every commit, judged by its digest). The run trains."""
    url = f"file://{tmp_path / 'bucket'}" if store == "file" else f"memory://{tmp_path.name}/run"
    algorithm = DiLoCo(sync_every=8, fragments=1, in_flight=1, quorum=2)
    options = attrs.evolve(FAST, spill_above=0, spill_dir=str(tmp_path))
    merges: list[tuple[bool, bool, bool]] = []
    sealed: dict[Role, list[bool]] = {Role.THETA: [], Role.MOMENTUM: []}
    ready = threading.Barrier(2)
    losses: dict[str, list[float]] = {}

    def watch(codec: FragmentCodec) -> None:
        merge_held, encode = codec.merge_held, codec.encode

        def merging(*args: Any, into: int | None = None, **kw: Any) -> Any:
            fragment, theta, momentum, deltas, contributions = args
            held = [d[0 : d.shape[0]] if isinstance(d, Spilled) else d.copy() for d in deltas]
            start = None if momentum is None else momentum.copy()
            expected = codec.merge_on(
                NumpyBackend(), fragment, theta, start, held, contributions, **kw
            )
            own = None if into is None else deltas[into]
            merged = merge_held(*args, into=into, **kw)
            merges.append((
                any(isinstance(d, Spilled) for d in deltas),
                own is not None and np.shares_memory(merged.theta, own),
                merged.theta.tobytes() == expected.theta.tobytes()
                and merged.momentum.tobytes() == expected.momentum.tobytes(),
            ))  # fmt: skip
            return merged

        def encoding(fragment: int, role: Role, round_: int, x: Any, *rest: Any, **kw: Any) -> Any:
            data, ref = encode(fragment, role, round_, x, *rest, **kw)
            if role in sealed:
                file = bare_file_of(x)
                sealed[role].append(file is not None and address(file) == address(data))
            return data, ref

        codec.merge_held = merging  # type: ignore[method-assign]
        codec.encode = encoding  # type: ignore[method-assign]

    def node(name: str, role: str) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        rng = np.random.default_rng(int(name[1:]))
        with Session(
            model, algorithm=algorithm, mailbox=url, node=name, role=role, options=options
        ) as session:
            if name == "n0":
                assert session._runtime is not None
                watch(session._runtime._codec)
            ready.wait(timeout=60)
            for _ in range(64):
                x = torch.from_numpy(rng.normal(size=(16, 64)).astype(np.float32))
                loss = ((model(x) - x.flip(1)) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.setdefault(name, []).append(loss.item())
                session.step(samples=16)

    threads = [
        threading.Thread(target=node, args=("n0", "both")),
        threading.Thread(target=node, args=("n1", "learner")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert set(losses) == {"n0", "n1"}, "a node failed (see its thread's traceback)"
    assert len(merges) >= 4, merges
    reused = store == "file"
    assert all(spilled_ and same for spilled_, _, same in merges), merges
    assert [placed for _, placed, _ in merges] == [reused] * len(merges), merges
    assert len(sealed[Role.THETA]) >= 4, sealed
    assert sealed[Role.THETA] == [reused] * len(sealed[Role.THETA]), sealed
    assert len(sealed[Role.MOMENTUM]) >= 3, sealed
    assert sealed[Role.MOMENTUM][1:] == [reused] * (len(sealed[Role.MOMENTUM]) - 1), sealed
    for name, curve in losses.items():
        assert np.mean(curve[-8:]) < np.mean(curve[:8]), name


@pytest.mark.parametrize("store", ["file", "memory"])
def test_a_streamed_read_of_a_local_or_memory_store_comes_in_ranges_of_one_version(
    store: str, tmp_path: Path
) -> None:
    """A local or memory store's body streamed (what a spill reads) arrives in ranges of
    :data:`RANGE_CHUNK` bytes, each a GET counted, and all of one version: an object
    rewritten midway fails the read, which is made again, whole, from the new version."""
    url = f"file://{tmp_path / 'bucket'}" if store == "file" else f"memory://{tmp_path.name}/r"
    key = "payloads/000000000001/x.st"
    old = bytes(range(256)) * (RANGE_CHUNK * 5 // 2 // 256)
    new = bytes(reversed(old))
    calls: list[list[int]] = []

    async def body(mailbox: Mailbox) -> tuple[Any, Any]:
        await mailbox.put_once(key, old)

        def sizes(chunks: Iterator[memoryview]) -> bytes:
            calls.append([])
            parts = []
            for chunk in chunks:
                calls[-1].append(len(chunk))
                parts.append(bytes(chunk))
            return b"".join(parts)

        whole = await mailbox.receive(key, sizes, stream=True)

        def rewritten(chunks: Iterator[memoryview]) -> bytes:
            first = bytes(next(chunks))
            if len(calls) == 1:
                asyncio.run(_put(url, key, new))
            calls.append([])
            return first + b"".join(bytes(c) for c in chunks)

        again = await mailbox.receive(key, rewritten, stream=True)
        return whole, again

    with Mailbox.open(url) as mailbox:
        whole, again = asyncio.run(body(mailbox))
        stats = mailbox.stats
    assert whole is not None
    assert whole.value == old
    assert calls[0] == [RANGE_CHUNK, RANGE_CHUNK, len(old) - 2 * RANGE_CHUNK]
    assert again is not None
    assert again.value == new
    assert len(calls) == 3  # the rewritten read was made again
    assert stats.get_requests >= 1 + 3 + 2


async def _put(url: str, key: str, data: bytes) -> None:
    """Overwrite ``key`` through a mailbox of its own (another writer)."""
    async with Mailbox.open(url) as other:
        await other.put(key, data)


@pytest.mark.parametrize("screened", [False, True])
def test_a_codecs_merge_of_spilled_deltas_is_numpys_merge_of_their_arrays(screened: bool) -> None:
    """``FragmentCodec.merge`` of deltas some of which are spilled (the closer's merge on a
    torch node: numpy then) gives what numpy's merge of the arrays gives, bit for bit:
    theta, momentum, cosine, and the outliers a screened merge leaves out."""
    screens = {"outlier_norm_factor": 3.0, "merge": MergeRule.MEDIAN} if screened else {}
    codec = FragmentCodec(manifest(**screens), NumpyBackend())
    torch_codec = FragmentCodec(manifest(**screens))  # compute "auto" would be torch here
    theta, momentum = values(codec, 0, 1), values(codec, 0, 2)
    deltas = [values(codec, 0, s) for s in (3, 4, 5)]
    deltas[2] *= 100.0 if screened else 1.0
    contributions = Contributions(learners=("a", "b", "c"), weights=(0.5, 0.25, 0.25))
    expected = codec.merge(0, theta, momentum.copy(), deltas, contributions)
    mixed = [deltas[0].copy(), spilled(deltas[1]), spilled(deltas[2])]
    got = torch_codec.merge(0, theta, momentum.copy(), mixed, contributions, into=0)
    assert got.theta.tobytes() == expected.theta.tobytes()
    assert got.momentum.tobytes() == expected.momentum.tobytes()
    assert (got.cosine, got.outliers) == (expected.cosine, expected.outliers)
    assert got.outliers == (("c",) if screened else ())
