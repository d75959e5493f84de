"""Bounded reads: hostile objects are refused by name before they cost memory, and once.

Every store answers a capped GET from its headers and a conditional GET with 304
(the two things :class:`gm_shell.reads.Reader` builds on). Then a fresh process
reads a bucket full of hostile objects — records and snapshots of 64 MiB, zstd
frames of ~32 KB that declare or decode to 1 GiB, a safetensors header nested
30,000 deep, a tensor declared at 16 GiB in a file of a few hundred bytes, a
payload bigger than its reference, a reference declaring 10 GiB — and each must
come back as a named verdict, the second read of each must download nothing, and
the process's peak RSS must grow by less than :data:`RSS_BOUND` over the whole lot.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import blake3
import numpy as np
import pytest
import zstandard
from hostile_objects import declared_tensor, nested_header, sealed, zeros_frame
from mailbox_targets import Target, local_target, server_target, store_params

from gm_core import auth, cluster, codec, keys, plan
from gm_core.records import (
    AlgorithmConfig,
    Compression,
    FragmentState,
    Head,
    Manifest,
    PayloadRef,
    Snapshot,
    TensorSpec,
)
from gm_shell import events
from gm_shell.align import newest_record
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.limits import MAX_LIST_PAGES, MAX_LISTED_KEYS, SMALL_RECORD_BYTES, json_limit
from gm_shell.mailbox import Got, TooLargeError, UnchangedError
from gm_shell.reads import Reader
from gm_shell.run import RunError, read_manifest

SCRIPT = Path(__file__).parent / "scripts" / "hostile_reads.py"
MiB = 1 << 20
GiB = 1 << 30
RSS_BOUND = 32 * MiB
"""Peak RSS growth allowed for reading every hostile object here twice (measured: see the
test's output; a single hostile object, downloaded or inflated, would cost 64 MiB to 1 GiB)."""

SCHEMA = (
    TensorSpec(name="a.weight", shape=(33, 5), dtype="F32"),
    TensorSpec(name="b.weight", shape=(7, 33), dtype="F32"),
)


@pytest.mark.parametrize("streamed", [False, True], ids=["get", "receive"])
def test_a_capped_get_is_refused_from_the_headers_and_a_known_etag_costs_no_body(
    target: Target, streamed: bool
) -> None:
    """The same for :meth:`Mailbox.get` and :meth:`Mailbox.receive` (a payload's read: the
    body handed to a consumer as it arrives, here joined)."""
    box = target.open()

    async def received(key: str, **caps: Any) -> Got | None:
        got = await box.receive(key, lambda chunks: b"".join(chunks), **caps)
        return None if got is None else Got(data=got.value, etag=got.etag)

    read = received if streamed else box.get
    content = np.random.default_rng(0).integers(0, 256, MiB, dtype=np.uint8).tobytes()

    async def body() -> None:
        await box.put("x/big.json", content)
        with pytest.raises(TooLargeError) as refused:
            await read("x/big.json", max_bytes=MiB - 1)
        assert (refused.value.size, refused.value.limit) == (MiB, MiB - 1)
        assert box.stats.bytes_in == 0
        got = await read("x/big.json", max_bytes=MiB)
        assert got is not None
        assert got.data == content
        assert refused.value.etag == got.etag
        with pytest.raises(UnchangedError):
            await read("x/big.json", if_none_match=got.etag)
        with pytest.raises(UnchangedError):  # a known refusal is not even looked at again
            await read("x/big.json", max_bytes=1, if_none_match=refused.value.etag)
        assert box.stats.bytes_in == MiB
        await box.put("x/big.json", b"{}")
        again = await read("x/big.json", max_bytes=1 << 10, if_none_match=got.etag)
        assert again is not None
        assert again.data == b"{}"
        assert await read("x/absent.json", if_none_match=got.etag) is None

    asyncio.run(body())


def test_a_listing_stops_at_its_cap(target: Target) -> None:
    box = target.open()
    flood = [keys.snapshot(3, f"flood-{i:03d}") for i in range(25)]

    async def body() -> None:
        await asyncio.gather(*(box.put_once(key, b"{}") for key in flood))
        found, cut = await box.list_capped(keys.snapshot_prefix(3), max_keys=10)
        assert cut
        assert len(found) == 10
        assert {x.key for x in found} <= set(flood)
        found, cut = await box.list_capped(keys.snapshot_prefix(3), max_keys=100)
        assert not cut
        assert [x.key for x in found] == flood
        assert [x.key for x in await box.list(keys.snapshot_prefix(3))] == flood

    asyncio.run(body())


def test_a_flooded_folder_costs_a_reader_four_pages_and_one_event(tmp_path: Path) -> None:
    """A claim or snapshot flood: the reader reads 4,000 keys of it and reports the cut once."""
    assert MAX_LISTED_KEYS == MAX_LIST_PAGES * 1000 == 4000
    target = local_target("file", tmp_path)
    folder = Path(target.url.removeprefix("file://")) / keys.claim_prefix(5)
    folder.mkdir(parents=True)
    for attempt in range(MAX_LISTED_KEYS + 1):  # written as files: 4,001 PUTs would be slow
        (folder / f"{attempt:04d}.json").write_bytes(b"{}")
    seen: list[events.Event] = []
    box = target.open()
    reader = Reader(
        node="n0",
        mailbox=box,
        codec=FragmentCodec(unseeded_manifest()),
        compute=asyncio.to_thread,
        emit=seen.append,
        clock=lambda: 0.0,
    )

    async def body() -> None:
        for _ in range(3):
            found, cut = await reader.list(keys.claim_prefix(5))
            assert (len(found), cut) == (MAX_LISTED_KEYS, True)
        assert await reader.list(keys.claim_prefix(4)) == ([], False)

    try:
        asyncio.run(body())
    finally:
        target.close()
    assert len(seen) == 1
    cut = seen[0]
    assert isinstance(cut, events.ListingCut)
    assert (cut.prefix, cut.limit, cut.round) == (keys.claim_prefix(5), MAX_LISTED_KEYS, 5)


def test_the_json_caps_hold_the_largest_records_a_correct_writer_makes() -> None:
    """The small caps are far above the largest snapshot, claim, lease and head."""
    big = 2**63 - 1
    ref = PayloadRef(key=keys.payload(10**12 - 1, "f" * 64), size=big, digest="f" * 64)
    largest = Snapshot(
        learner="n" * 64,
        round=10**12 - 1,
        fragment=big,
        base_version=big,
        steps=big,
        tokens=big,
        step_s=1.2345678901234567e300,
        schema_digest="f" * 64,
        payload=ref,
        final=True,
        signature="s" * 512,
    )
    assert len(codec.encode(largest)) * 16 < SMALL_RECORD_BYTES
    assert len(codec.encode(Head(round=10**12 - 1))) * 16 < SMALL_RECORD_BYTES
    assert json_limit(keys.snapshot(3, "n0")) == SMALL_RECORD_BYTES
    assert json_limit(keys.claim(3, 9999)) == SMALL_RECORD_BYTES
    assert json_limit(keys.round_record(3)) == codec.MAX_RECORD_BYTES
    assert json_limit(keys.manifest()) == codec.MAX_RECORD_BYTES


# -- a bucket full of hostile objects, read by a fresh process -------------------------------


def ref_of(data: bytes, round_: int = 7) -> PayloadRef:
    digest = blake3.blake3(data).hexdigest()
    return PayloadRef(key=keys.payload(round_, digest), size=len(data), digest=digest)


@attrs.define
class Bucket:
    """Hostile objects and the cases that read them, written through one mailbox."""

    objects: dict[str, bytes] = attrs.field(factory=dict)
    cases: list[dict[str, Any]] = attrs.field(factory=list)

    def record(self, name: str, key: str, data: bytes) -> None:
        self.objects[key] = data
        self.cases.append({"name": name, "kind": "json", "key": key})

    def payload(self, name: str, data: bytes | None, ref: PayloadRef | None = None) -> None:
        ref = ref or ref_of(data or b"")
        if data is not None:
            self.objects[ref.key] = data
        self.cases.append(
            {
                "name": name,
                "kind": "payload",
                "fragment": 0,
                "role": "delta",
                "ref": attrs.asdict(ref),
            }
        )


def unseeded_manifest() -> Manifest:
    """A manifest of :data:`SCHEMA` with zstd payloads and no initial state yet."""
    cfg = AlgorithmConfig(sync_every=8, fragments=2, compression=Compression.ZSTD)
    return Manifest(
        run_id="r",
        created_by="n0",
        config=cfg,
        schema=SCHEMA,
        plan=plan.make_plan(SCHEMA, cfg),
        init=(),
    )


@pytest.fixture(scope="module")
def hostile() -> tuple[Manifest, Bucket]:
    unseeded = unseeded_manifest()
    cfg = unseeded.config
    fragments = FragmentCodec(unseeded)
    bucket = Bucket()
    init = []
    for f in range(cfg.fragments):
        data, ref = fragments.encode(f, Role.THETA, 0, np.zeros(fragments.size(f), np.float32))
        bucket.objects[ref.key] = data
        init.append(FragmentState(version=0, theta=ref, momentum=None))
    manifest = attrs.evolve(unseeded, init=tuple(init))
    bucket.objects[keys.manifest()] = codec.encode(manifest)

    bucket.record("record-64MiB", keys.round_record(7), b" " * (64 * MiB))
    bucket.record("snapshot-1MiB", keys.snapshot(7, "evil"), b"{" * MiB)
    bucket.record("record-garbage", keys.round_record(8), b"{not json")
    bucket.payload("zstd-declares-1GiB", zeros_frame(GiB, declare=True))
    bucket.payload("zstd-inflates-to-1GiB", zeros_frame(GiB, declare=False))
    bucket.payload("nested-header", sealed(nested_header(30_000)))
    bucket.payload("tensor-of-16GiB", sealed(declared_tensor("a.weight", 16 * GiB)))
    big = bytes(64 * MiB)
    bucket.payload("bigger-than-its-ref", big, attrs.evolve(ref_of(big), size=1000))
    ten = ref_of(b"absent")
    bucket.payload("ref-declares-10GiB", None, attrs.evolve(ten, size=10 * GiB))
    good, good_ref = fragments.encode(0, Role.DELTA, 7, np.ones(fragments.size(0), np.float32))
    flipped = bytearray(good)
    flipped[-1] ^= 1
    bucket.payload("digest-mismatch", bytes(flipped), attrs.evolve(good_ref, size=len(flipped)))
    file = zstandard.ZstdDecompressor().decompress(good)  # a right file, then 1 GiB of zeros
    bucket.payload("file-then-1GiB", zeros_frame(GiB, declare=False, prefix=file))
    # Last, as a control of the measurement: the 64 MiB record read without a cap.
    bucket.cases.append({"name": "control", "kind": "control", "key": keys.round_record(7)})
    return manifest, bucket


EXPECTED = {
    "record-64MiB": "too_large",
    "snapshot-1MiB": "too_large",
    "record-garbage": "read",
    "zstd-declares-1GiB": "corrupt: zstd frame declares 1073741824 bytes",
    "zstd-inflates-to-1GiB": "corrupt: header is not JSON",
    "file-then-1GiB": "corrupt: zstd frame does not decode to",
    "nested-header": "corrupt: header nests too deeply",
    "tensor-of-16GiB": "corrupt: tensor 'a.weight': declared to end at byte",
    "bigger-than-its-ref": "corrupt: payloads/",
    "ref-declares-10GiB": "corrupt: payloads/",
    "digest-mismatch": "corrupt: payloads/",
}
REFUSED_UNREAD = {"record-64MiB", "snapshot-1MiB", "bigger-than-its-ref", "ref-declares-10GiB"}


@pytest.mark.parametrize("store", store_params(("file", "seaweedfs")))
def test_hostile_objects_get_named_verdicts_in_bounded_memory_and_are_read_once(
    store: str,
    hostile: tuple[Manifest, Bucket],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    if store == "file":
        target = local_target("file", tmp_path)
    else:
        server = request.getfixturevalue(store)
        target = server_target(store, server.url, server.options)
    _, bucket = hostile
    try:
        box = target.open()

        async def write() -> None:
            for key, data in bucket.objects.items():
                await box.put_once(key, data)

        asyncio.run(write())
    finally:
        target.close()
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            target.url,
            json.dumps(attrs.asdict(target.options)),
            json.dumps(bucket.cases),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    print(json.dumps(results, indent=1))  # the measured figures, for -s
    first = {r["name"]: r for r in results if r["attempt"] == 1}
    second = {r["name"]: r for r in results if r["attempt"] == 2}
    for name, verdict in EXPECTED.items():
        assert first[name]["verdict"].startswith(verdict), first[name]
        assert second[name]["verdict"] == first[name]["verdict"], second[name]
        assert second[name]["received"] == 0, second[name]  # remembered by ETag
        assert second[name]["refused_events"] == (name == "ref-declares-10GiB"), second[name]
    for name in REFUSED_UNREAD:
        assert first[name]["received"] == 0, first[name]
        assert first[name]["refused_events"] == 1, first[name]
    assert first["record-garbage"]["received"] == len(b"{not json")
    assert max(r["peak_growth"] for r in results if r["name"] != "control") < RSS_BOUND
    # The measurement sees what a single uncapped read of one hostile object costs.
    assert first["control"]["peak_growth"] > 48 * MiB, first["control"]


def test_one_shot_readers_refuse_an_oversized_manifest_and_record_by_name(tmp_path: Path) -> None:
    """Joining, align() and gm status read with the same caps as the machines."""
    target = local_target("file", tmp_path)
    box = target.open()

    async def body() -> None:
        await box.put_once(keys.manifest(), b" " * (codec.MAX_RECORD_BYTES + 1))
        with pytest.raises(RunError, match=r"manifest is unreadable: .* over the 4,194,304-byte"):
            await read_manifest(box, None)
        await box.put_once(keys.round_record(0), b" " * (codec.MAX_RECORD_BYTES + 1))
        config = AlgorithmConfig(sync_every=8, fragments=2)
        manifest = cluster.create(config, {"n0": frozenset(cluster.Machine)}).manifest
        newest, stopped = await newest_record(box, auth.for_run("r", None), manifest)
        assert newest is None
        assert stopped == ""  # skipped unread (slot 0, protocol §16.4): round 0 is not written
        assert box.stats.bytes_in == 0

    try:
        asyncio.run(body())
    finally:
        target.close()
