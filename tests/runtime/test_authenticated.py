"""Authenticated runs with real Sessions over a real file:// bucket (issue 12 item 1).

Two nodes share a run key and train; a forger with write access to the same folder
but without the key writes, for the rounds about to open, codec-valid snapshots that
are bare, tagged under another key, and genuine snapshots of the run replayed under
another learner's name, garbage or a genuine record replayed at every other round's
record key (slot 0), and overwrites the head hint and a lease with its own. The
run trains to the same loss as ever, every record on the tape authenticates (those
of rounds whose slot 0 the forger took sit at slot 1, protocol §16.4), the
forged snapshots are rejected by name (``unauthenticated``) and never merged, payload
digests are keyed, and nodes with no key or another key are refused by name.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_worker import torch_model
from test_session import FAST, algorithm, flat, train

from gm_core import auth, codec, keys
from gm_core.records import AlgorithmConfig, Head, Lease, PayloadRef, Reason, RoundRecord, Snapshot
from gm_core.tape import BadRecord, record_key
from gm_shell import RunError, RunKeyError, Session, align, keygen
from gm_shell.cli import main
from gm_shell.mailbox import Mailbox
from gm_shell.payload import content_hash
from gm_shell.run import read_manifest
from gm_shell.runkey import FROM_ENV, open_run_warning, resolve
from gm_shell.tapereads import read_record

KEY = bytes(range(32))
OTHER = auth.derive(bytes(range(1, 33)))
FORGED = {"evil-bare", "evil-otherkey", "evil-replay"}


def run_keyed(url: str, steps: int, stop: threading.Event) -> list[dict[str, Any]]:
    def make(i: int, model: Any) -> Session:
        return Session(
            model, algorithm=algorithm(), mailbox=url, node=f"n{i}", options=FAST, run_key=KEY
        )

    return run_pair(make, steps, stop)


def run_pair(
    make: Callable[[int, Any], Session], steps: int, stop: threading.Event
) -> list[dict[str, Any]]:
    """Two nodes, ``make(i, model)``'s sessions, training ``steps`` on threads; then ``stop``."""
    results: list[dict[str, Any]] = [{}, {}]
    barrier = threading.Barrier(2)

    def node(i: int) -> None:
        model, step = torch_model(seed=i)
        session = make(i, model)
        with session:
            losses = train(session, step, steps, seed=i)
            barrier.wait(timeout=60)
        results[i] = {"model": model, "losses": losses, "checkpoint": session.checkpoint}

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    stop.set()
    assert all(results), "a node failed (see the thread's traceback above)"
    return results


def forge(url: str, stop: threading.Event, failures: list[BaseException]) -> None:
    """Write forgeries for the next two rounds whenever the tape moves."""
    try:
        asyncio.run(_forge(url, stop))
    except BaseException as error:
        failures.append(error)
        raise


async def _forge(url: str, stop: threading.Event) -> None:
    done: set[int] = set()
    async with Mailbox.open(url) as box:
        while not stop.is_set():
            rounds = [keys.parse(x.key) for x in await box.list(keys.ROUNDS_PREFIX)]
            # The run's records: at named slots, or at slot 0 of a round it did not squat.
            run = [k for k in rounds if isinstance(k, keys.RoundKey) and (k.round % 2 or k.name)]
            newest = max((k.round for k in run if isinstance(k, keys.RoundKey)), default=-1)
            for target in (newest + 1, newest + 2):
                if target not in done:
                    done.add(target)
                    await _forge_round(box, newest, target)
            await asyncio.sleep(0.05)


async def _forge_round(box: Mailbox, newest: int, target: int) -> None:
    genuine = None
    if newest >= 0:  # a genuine snapshot of the newest round, to replay
        for listed in await box.list(keys.snapshot_prefix(newest)):
            got = await box.get(listed.key)
            if got is not None and not listed.key.endswith("/evil-bare.json"):
                genuine = got.data
                break
    body = codec.encode(
        Snapshot(
            learner="evil-bare",
            round=target,
            fragment=target % 2,
            base_version=0,
            steps=8,
            tokens=256,
            step_s=0.01,
            schema_digest="0" * 64,
            payload=await _any_payload(box),
        )
    )
    await box.put_once(keys.snapshot(target, "evil-bare"), body)
    key = keys.snapshot(target, "evil-otherkey")
    await box.put_once(key, auth.for_run("whatever", OTHER).seal(key, body))
    if genuine is not None:
        await box.put_once(keys.snapshot(target, "evil-replay"), genuine)
    if target % 2 == 0:  # the round's record key, before its closer writes there
        record = await box.get(keys.round_record(newest)) if newest >= 0 else None
        squat = b"\x00garbage" if record is None or target % 4 == 0 else record.data
        await box.put_once(keys.round_record(target), squat)
    await box.put(keys.head(), codec.encode(Head(round=target + 1000)))
    lease = Lease(node="evil-bare", roles=("learner", "closer"), seq=target, renew_s=1.0)
    await box.put(keys.lease("evil-bare"), codec.encode(lease))


async def _any_payload(box: Mailbox) -> PayloadRef:
    """A payload of the run, named by its unkeyed digest (all a forger can compute)."""
    for listed in reversed(await box.list(keys.PAYLOADS_PREFIX)):
        got = await box.get(listed.key)
        if got is not None:  # else swept since the listing
            digest = await asyncio.to_thread(content_hash, got.data)
            return PayloadRef(key=listed.key, size=len(got.data), digest=digest)
    raise AssertionError("the run has no payloads")


def tape(url: str) -> list[RoundRecord]:
    """Every record, opened with the run key (a record that does not open fails here)."""
    return asyncio.run(_tape(url))


async def _tape(url: str) -> list[RoundRecord]:
    run_auth = auth.derive(KEY)
    async with Mailbox.open(url) as box:
        manifest = await read_manifest(box, run_auth)
        assert manifest is not None
        envelope = auth.of_run(manifest, run_auth)
        records: list[RoundRecord] = []
        while (got := await _record(box, envelope, manifest.config, len(records))) is not None:
            assert isinstance(got, RoundRecord), got
            records.append(got)
            payload = await box.get(records[-1].theta.key)
            if payload is not None:  # kept: the newest cycles
                digest = records[-1].theta.digest
                keyed = await asyncio.to_thread(content_hash, payload.data, run_auth.payload_key)
                assert keyed == digest
                assert await asyncio.to_thread(content_hash, payload.data) != digest
        listed = {x.key for x in await box.list(keys.ROUNDS_PREFIX)}
        slot_1 = {record_key(envelope, r.round, 1) for r in records}
        assert listed & slot_1, "no round's slot 0 was taken by the forger"
        assert listed <= slot_1 | {keys.round_record(r) for r in range(len(records) + 2)}
    return records


async def _record(
    box: Mailbox, envelope: auth.Envelope, config: AlgorithmConfig, round_: int
) -> RoundRecord | BadRecord | None:
    return (await read_record(box, envelope, config, round_)).record


def test_an_authenticated_run_trains_and_refuses_every_forgery(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    stop = threading.Event()
    failures: list[BaseException] = []
    forger = threading.Thread(target=forge, args=(url, stop, failures))

    def start_forger_after_the_run_exists() -> None:
        while not stop.is_set() and not (tmp_path / "bucket" / "manifest.json").exists():
            stop.wait(0.05)
        forger.start()

    waiter = threading.Thread(target=start_forger_after_the_run_exists)
    waiter.start()
    results = run_keyed(url, steps=160, stop=stop)
    waiter.join()
    forger.join(timeout=30)
    assert not failures
    for r in results:
        assert np.mean(r["losses"][-10:]) < 0.2 * np.mean(r["losses"][:10])
    records = tape(url)
    assert len(records) >= 10
    merged = {p.learner for r in records for p in r.participants}
    assert merged <= {"n0", "n1"}
    refused = {(j.learner, j.reason) for r in records for j in r.rejections}
    for name in FORGED:
        assert (name, Reason.UNAUTHENTICATED) in refused, (name, refused)
    evaluator, _ = torch_model(seed=42)
    loaded = align(evaluator, mailbox=url, run_key=KEY.hex())
    assert loaded.round == records[-1].round
    newest = max(results, key=lambda r: r["checkpoint"].round)
    if newest["checkpoint"].round == loaded.round:
        np.testing.assert_array_equal(flat(evaluator), flat(newest["model"]))


def test_nodes_without_the_key_or_with_another_are_refused_by_name(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    model, _ = torch_model(seed=0)
    with Session(
        model, algorithm=algorithm(quorum=1), mailbox=url, node="n0", options=FAST, run_key=KEY
    ):
        key_id = auth.derive(KEY).key_id
        with pytest.raises(RunError, match=f"run key id {key_id}"):
            align(torch_model(seed=1)[0], mailbox=url, run_key=None)
        with pytest.raises(RunError, match=f"{OTHER.key_id}.*{key_id}"):
            Session(
                torch_model(seed=1)[0],
                algorithm=algorithm(quorum=1),
                mailbox=url,
                node="n1",
                options=FAST,
                run_key=bytes(range(1, 33)),
            ).start()
    open_url = f"file://{tmp_path / 'open'}"
    opened = Session(
        model, algorithm=algorithm(quorum=1), mailbox=open_url, node="n0", options=FAST
    )
    with opened, pytest.raises(RunError, match="run is open"):
        align(torch_model(seed=1)[0], mailbox=open_url, run_key=KEY)


def test_shared_buckets_need_a_key_or_an_explicit_open_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GM_RUN_KEY", raising=False)
    monkeypatch.delenv("GM_RUN_KEY_FILE", raising=False)
    for url in ("s3://bucket/run", "gs://bucket/run", "az://container/run"):
        with pytest.raises(RunKeyError, match="GM_RUN_KEY"):
            resolve(FROM_ENV, url)
        assert resolve(None, url) is None
        assert "open run" in (open_run_warning(url, None) or "")
        assert resolve(FROM_ENV, url, writes=False) is None
    assert resolve(FROM_ENV, "file:///tmp/run") is None
    assert open_run_warning("file:///tmp/run", None) is None
    key = keygen()
    monkeypatch.setenv("GM_RUN_KEY", key)
    derived = resolve(FROM_ENV, "s3://bucket/run")
    assert derived is not None
    assert derived.key_id == auth.derive(bytes.fromhex(key)).key_id
    assert open_run_warning("s3://bucket/run", derived) is None
    monkeypatch.setenv("GM_RUN_KEY", "not a key")
    with pytest.raises(RunKeyError, match="64 hex characters"):
        resolve(FROM_ENV, "file:///tmp/run")


def test_the_key_file_is_read_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GM_RUN_KEY", raising=False)
    path = tmp_path / "key"
    path.write_text(KEY.hex() + "\n")
    monkeypatch.setenv("GM_RUN_KEY_FILE", str(path))
    derived = resolve(FROM_ENV, "s3://bucket/run")
    assert derived is not None
    assert derived.key_id == auth.derive(KEY).key_id
    path.write_bytes(b"0" * 10_000)
    with pytest.raises(RunKeyError, match="not a run key"):
        resolve(FROM_ENV, "s3://bucket/run")
    monkeypatch.setenv("GM_RUN_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(RunKeyError, match="missing"):
        resolve(FROM_ENV, "s3://bucket/run")


def test_keygen_and_status_speak_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GM_RUN_KEY", raising=False)
    monkeypatch.delenv("GM_RUN_KEY_FILE", raising=False)
    assert main(["keygen"]) == 0
    printed = capsys.readouterr().out.strip()
    assert auth.parse_key(printed) != auth.parse_key(keygen())  # fresh random keys
    url = f"file://{tmp_path / 'bucket'}"
    model, _ = torch_model(seed=0)
    session = Session(
        model, algorithm=algorithm(quorum=1), mailbox=url, node="n0", options=FAST, run_key=KEY
    )
    with session:  # (gm status in this process closes every mailbox: after the session)
        pass
    assert main(["status", url]) == 1
    assert f"run key id {auth.derive(KEY).key_id}" in capsys.readouterr().err
    monkeypatch.setenv("GM_RUN_KEY", KEY.hex())
    assert main(["status", url]) == 0
    assert f"authenticated (key id {auth.derive(KEY).key_id})" in capsys.readouterr().out
