"""One conformance suite that every store passes identically.

Each test runs on memory, a local folder, SeaweedFS, moto and Azurite (real
servers on loopback, see ``conftest.py``), under a fresh run prefix. What it
pins down is what the protocol assumes of a bucket (``spec/store-model.md``):
create-once with exactly one winner, read-after-write, sorted listing with an
offset, deletes that tolerate absent keys, ETags that change on overwrite and
read the same everywhere, large payloads, and a request count that matches the
work asked for.
"""

from __future__ import annotations

import asyncio
import math
import random
import warnings

import pytest
from mailbox_targets import Target

from gm_shell.accounting import RequestClass
from gm_shell.mailbox import Listed, Mailbox, PutOutcome, TooLargeError

WRITERS = 16
RACE_KEYS = 3
LARGE_BYTES = 64 * 1024 * 1024


# SeaweedFS checks If-None-Match under a short-lived lock (seaweedfs#8800, fixed in
# #8801); with its process starved of CPU (the full suite on 2 cores) two of 16
# writers both won one key in one CI run of many, and 0 of 200 keys on a quiet
# machine. So on SeaweedFS one lost race is retried on fresh keys and reported as a
# warning; a second one fails. Every other store gets no second chance.
RACE_ATTEMPTS = {"seaweedfs": 2}


def test_put_once_has_exactly_one_winner(target: Target) -> None:
    """16 writers (separate mailboxes, separate connections) race on each of 3 keys."""
    writers = [target.open() for _ in range(WRITERS)]
    attempts = RACE_ATTEMPTS.get(target.name, 1)
    for attempt in range(attempts):
        doubles = asyncio.run(
            race(writers, [f"rounds/{attempt}{k:011d}.json" for k in range(RACE_KEYS)])
        )
        if not doubles:
            return
        assert attempt + 1 < attempts, f"more than one writer won: {doubles}"
        warnings.warn(
            f"{target.name}: more than one writer won {doubles}; racing again", stacklevel=1
        )


async def race(writers: list[Mailbox], keys: list[str]) -> dict[str, list[int]]:
    """Every writer puts every key once; the keys more than one writer won, with those writers."""
    races = [
        writer.put_once(key, f"{key} by writer {i}".encode())
        for key in keys
        for i, writer in enumerate(writers)
    ]
    outcomes = await asyncio.gather(*races)
    doubles = {}
    for k, key in enumerate(keys):
        row = outcomes[k * WRITERS : (k + 1) * WRITERS]
        winners = [i for i, outcome in enumerate(row) if outcome is PutOutcome.CREATED]
        assert winners, f"{key}: nobody won"
        if len(winners) > 1:
            doubles[key] = winners
            continue
        got = await writers[0].get(key)
        assert got is not None
        assert got.data == f"{key} by writer {winners[0]}".encode()
        # A late writer still loses, and the winner's bytes stay.
        assert await writers[-1].put_once(key, b"late") is PutOutcome.EXISTS
        assert (await writers[1].get(key)) == got
    return doubles


def test_read_after_write(target: Target) -> None:
    writer, reader = target.open(), target.open()

    async def body() -> None:
        assert await writer.put_once("snapshots/000000000001/a.json", b"one") is PutOutcome.CREATED
        got = await reader.get("snapshots/000000000001/a.json")
        assert got is not None
        assert got.data == b"one"
        assert await reader.probe("snapshots/000000000001/a.json") == got.etag
        etag = await writer.put("head.json", b"h1")
        assert await reader.get("head.json") == type(got)(data=b"h1", etag=etag)
        listed = await reader.list("snapshots/000000000001/")
        assert listed == [Listed(key="snapshots/000000000001/a.json", size=3, etag=got.etag)]

    asyncio.run(body())


def test_etag_changes_on_overwrite_and_reads_the_same_everywhere(target: Target) -> None:
    mailbox = target.open()

    async def body() -> None:
        first = await mailbox.put("leases/node-a.json", b'{"renewal": 1}')
        second = await mailbox.put("leases/node-a.json", b'{"renewal": 2}')
        assert first != second
        assert '"' not in first
        assert '"' not in second
        assert await mailbox.probe("leases/node-a.json") == second
        got = await mailbox.get("leases/node-a.json")
        assert got is not None
        assert got.etag == second
        assert got.data == b'{"renewal": 2}'
        (listed,) = await mailbox.list("leases/")
        assert listed.etag == second

    asyncio.run(body())


def test_absent_keys_are_answers(target: Target) -> None:
    mailbox = target.open()

    async def body() -> None:
        assert await mailbox.get("rounds/000000000007.json") is None
        assert await mailbox.probe("rounds/000000000007.json") is None
        assert await mailbox.list("rounds/") == []
        await mailbox.delete(["rounds/000000000007.json", "nothing/here"])
        assert await mailbox.delete_prefix("rounds/") == 0
        assert mailbox.stats.failures == 0

    asyncio.run(body())


def test_list_is_sorted_with_string_prefix_and_offset(target: Target) -> None:
    mailbox = target.open()
    keys = [f"rounds/{r:012d}.json" for r in range(12)]
    others = ["rounds/x/nested.json", "roundsX.json", "leases/a.json", "a.json"]
    shuffled = keys + others
    random.Random(7).shuffle(shuffled)

    async def body() -> None:
        await asyncio.gather(*(mailbox.put_once(k, k.encode()) for k in shuffled))
        in_rounds = [item.key for item in await mailbox.list("rounds/")]
        assert in_rounds == sorted([*keys, "rounds/x/nested.json"])
        everything = await mailbox.list("")
        assert [item.key for item in everything] == sorted(shuffled)
        assert all(item.size == len(item.key) for item in everything)
        after = [item.key for item in await mailbox.list("rounds/", offset=keys[8])]
        assert after == [*keys[9:], "rounds/x/nested.json"]
        # A partial last segment is a plain string prefix, like the model store's.
        assert [i.key for i in await mailbox.list("rounds/00000000001")] == keys[10:]
        assert [i.key for i in await mailbox.list("rounds")] == sorted(
            [*keys, "rounds/x/nested.json", "roundsX.json"]
        )
        tail = await mailbox.list("rounds/00000000001", offset=keys[10])
        assert [i.key for i in tail] == keys[11:]

    asyncio.run(body())


def test_delete_and_delete_prefix(target: Target) -> None:
    mailbox = target.open()
    doomed = [f"payloads/000000000001/{d:064x}.st" for d in range(5)]
    kept = ["payloads/000000000002/keep.st", "payloadsX/keep.st"]

    async def body() -> None:
        await asyncio.gather(*(mailbox.put_once(k, b"x") for k in doomed + kept))
        await mailbox.delete([doomed[0], doomed[1], "payloads/absent.st"])
        assert await mailbox.get(doomed[0]) is None
        assert await mailbox.delete_prefix("payloads/000000000001/") == 3
        remaining = [item.key for item in await mailbox.list("")]
        assert remaining == sorted(kept)

    asyncio.run(body())


def test_large_payload_round_trips(target: Target) -> None:
    """A 64 MiB payload, written create-once in one request and read back whole."""
    mailbox = target.open()
    data = random.Random(64).randbytes(LARGE_BYTES)

    async def body() -> None:
        before = mailbox.stats
        assert await mailbox.put_once("payloads/big.st", data) is PutOutcome.CREATED
        got = await mailbox.get("payloads/big.st")
        assert got is not None
        assert got.data == data
        (listed,) = await mailbox.list("payloads/")
        assert listed.size == LARGE_BYTES
        spent = mailbox.stats - before
        assert spent.put_requests - spent.retries <= 1
        assert spent.bytes_out >= LARGE_BYTES
        assert spent.bytes_in == LARGE_BYTES

    asyncio.run(body())


def test_a_bounded_get_refuses_a_bigger_object_by_its_declared_size(target: Target) -> None:
    mailbox = target.open()
    data = random.Random(8).randbytes(1 << 20)

    async def body() -> None:
        await mailbox.put("nodes/a/resume.bin", data)
        with pytest.raises(TooLargeError, match="1,048,576 bytes, over the 1,048,575-byte limit"):
            await mailbox.get("nodes/a/resume.bin", max_bytes=len(data) - 1)
        got = await mailbox.get("nodes/a/resume.bin", max_bytes=len(data))
        assert got is not None
        assert got.data == data
        assert await mailbox.get("nodes/b/resume.bin", max_bytes=1) is None

    asyncio.run(body())


def test_requests_are_counted_by_class(target: Target) -> None:
    """The same script costs the same requests on every store (DELETE batching aside)."""
    mailbox = target.open()

    async def body() -> None:
        await mailbox.put_once("rounds/000000000001.json", b"r1")  # PUT
        await mailbox.put_once("rounds/000000000001.json", b"r1")  # PUT (exists)
        await mailbox.put("head.json", b"h")  # PUT
        await mailbox.get("rounds/000000000001.json")  # GET
        await mailbox.get("rounds/000000000002.json")  # GET (absent)
        await mailbox.probe("rounds/000000000001.json")  # GET (HEAD)
        await mailbox.probe("rounds/000000000002.json")  # GET (HEAD, absent)
        await mailbox.list("rounds/")  # LIST
        await mailbox.delete(["rounds/000000000001.json", "head.json"])  # DELETE batch

    asyncio.run(body())
    stats = mailbox.stats
    batch = mailbox.handle.delete_batch_keys
    asked = {
        RequestClass.PUT: 3,
        RequestClass.GET: 4,
        RequestClass.LIST: 1,
        RequestClass.DELETE: math.ceil(2 / batch),
    }
    # Only a retried attempt may add to a class; there are none on a healthy server.
    assert stats.retries == 0, stats
    assert {cls: stats.requests(cls) for cls in RequestClass} == asked
    assert stats.bytes_out == 2 + 2 + 1
    assert stats.bytes_in == 2
    assert stats.failures == 0


@pytest.mark.parametrize("size", [0, 1, 5 * 1024 * 1024 + 1])
def test_odd_sizes_round_trip(target: Target, size: int) -> None:
    """Empty objects, and one byte past obstore's multipart threshold."""
    mailbox = target.open()
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)

    async def body() -> None:
        await mailbox.put(f"odd/{size}", data)
        got = await mailbox.get(f"odd/{size}")
        assert got is not None
        assert got.data == data

    asyncio.run(body())
