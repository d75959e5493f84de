"""Per-node keys with real Sessions over a real file:// bucket (spec/protocol.md §16.3).

Two nodes (``n0``, ``n1``: learner and closer) train an authenticated run whose roster
also admits ``mallory`` as a learner. Mallory is a *member*: it holds the run key and
its own node key, so everything it writes carries a valid tag and a valid signature —
its own. While the run trains it writes, for the next round, what a run key alone
cannot refuse: a commit (a plausible record chaining to the newest one, whose theta is
a payload of its own model under the run's keyed digest) and a snapshot in ``n1``'s
name. Both are refused by name (``not_allowed``), the run goes on, every record on the
tape is signed by a closer of the roster, and no node or evaluator ever holds
mallory's model. With the signature check planted out, the same forged commit is what
the nodes load (``test_without_the_signature_check_the_member_forges_the_commit``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from runtime_bucket import committing
from runtime_worker import torch_model
from test_authenticated import run_pair
from test_session import FAST, algorithm, flat, train

from gm_core import auth, keys, plan, schedule
from gm_core.records import (
    FragmentState,
    Manifest,
    Member,
    RoundRecord,
    Snapshot,
)
from gm_core.tape import chain_digest
from gm_shell import NodeKeyError, ResumeError, Session, align, events, resume
from gm_shell.cli import main
from gm_shell.fragments import FragmentCodec, Role, payload_key
from gm_shell.mailbox import Mailbox
from gm_shell.nodekeys import make_roster, public_key, reader, signing_for, with_signing
from gm_shell.run import read_manifest
from gm_shell.tapereads import read_record

RUN_KEY = bytes(range(32))
NODE_KEYS = {name: bytes([i + 1]) * 32 for i, name in enumerate(["n0", "n1", "mallory"])}
AUTHORITY = bytes([9]) * 32
ROSTER = make_roster(
    AUTHORITY,
    [
        Member(node="n0", roles=("learner", "closer"), public_key=public_key(NODE_KEYS["n0"])),
        Member(node="n1", roles=("learner", "closer"), public_key=public_key(NODE_KEYS["n1"])),
        Member(node="mallory", roles=("learner",), public_key=public_key(NODE_KEYS["mallory"])),
    ],
)
MALLORY = 7.0
"""Every value of mallory's model: nobody trained it."""


def session(
    url: str, name: str, model: Any, got: list[events.Event], algo: Any = None, **over: Any
) -> Session:
    fields: dict[str, Any] = {
        "node": name,
        "options": FAST,
        "run_key": RUN_KEY,
        "node_key": NODE_KEYS[name],
        "roster": ROSTER,
        "callbacks": [got.append],
        **over,
    }
    return Session(model, algorithm=algo or algorithm(), mailbox=url, **fields)


def run_two(url: str, steps: int, stop: threading.Event) -> list[dict[str, Any]]:
    got: list[list[events.Event]] = [[], []]
    results = run_pair(lambda i, model: session(url, f"n{i}", model, got[i]), steps, stop)
    return [{**r, "events": g} for r, g in zip(results, got, strict=True)]


# --- mallory -------------------------------------------------------------------------


@attrs.frozen
class Mallory:
    """What mallory knows: the manifest, its envelope (signing as itself), a reader's."""

    manifest: Manifest
    mine: auth.Envelope
    reading: auth.Envelope
    codec: FragmentCodec


async def _as_mallory(box: Mailbox) -> Mallory:
    run_auth = auth.derive(RUN_KEY)
    manifest = await read_manifest(box, run_auth)
    assert manifest is not None
    signing = signing_for(manifest, "mallory", NODE_KEYS["mallory"], ("learner",))
    mine = auth.of_run(manifest, with_signing(run_auth, signing))
    reading = auth.of_run(manifest, reader(run_auth, manifest))
    fragments = FragmentCodec(manifest, payload_key=payload_key(run_auth))
    return Mallory(manifest=manifest, mine=mine, reading=reading, codec=fragments)


async def _newest(box: Mailbox, m: Mallory) -> RoundRecord | None:
    rounds = [keys.parse(x.key) for x in await box.list(keys.ROUNDS_PREFIX)]
    for r in sorted({k.round for k in rounds if isinstance(k, keys.RoundKey)}, reverse=True):
        got = (await read_record(box, m.reading, m.manifest.config, r)).record
        if isinstance(got, RoundRecord):
            return got
    return None


async def _own_theta(box: Mailbox, m: Mallory, fragment: int, round_: int) -> FragmentState:
    """Mallory's model of ``fragment`` uploaded as a payload the run's digests accept."""
    shapes = {t.name: t.shape for t in m.manifest.schema}
    size = sum(math.prod(shapes[n]) for n in m.manifest.plan.fragments[fragment])
    x = np.full(size, MALLORY, dtype=np.float32)
    data, ref = await asyncio.to_thread(m.codec.encode, fragment, Role.THETA, round_, x)
    await box.put_once(ref.key, data)
    return FragmentState(version=0, theta=ref, momentum=None)


async def _forge(box: Mailbox, m: Mallory, newest: RoundRecord) -> None:
    config = m.manifest.config
    target = newest.round + 1
    fragment = schedule.fragment_of(target, config.fragments)
    own = await _own_theta(box, m, fragment, target)
    record = attrs.evolve(
        committing(newest, target, own.theta, config),
        prev=chain_digest(newest),
        rejections=(),
        closer="mallory",  # in another closer's name it is refused whoever may write records
    )
    key = keys.round_record(target)
    await box.put_once(key, m.mine.pack(key, record))
    snapshot = Snapshot(
        learner="n1",
        round=target,
        fragment=fragment,
        base_version=newest.frontier[fragment].version,
        steps=config.sync_every,
        tokens=10**6,
        step_s=0.01,
        schema_digest=plan.schema_digest(m.manifest.schema),
        payload=own.theta,
    )
    key = keys.snapshot(target, "n1")
    await box.put_once(key, m.mine.pack(key, snapshot))


async def _mallory(url: str, stop: threading.Event, forged: list[int]) -> None:
    async with Mailbox.open(url) as box:
        m = await _as_mallory(box)
        while not stop.is_set():
            newest = await _newest(box, m)
            if newest is not None and newest.round + 1 not in forged:
                forged.append(newest.round + 1)
                await _forge(box, m, newest)
            await asyncio.sleep(0.02)


@pytest.fixture
def keyed_run(tmp_path: Path) -> tuple[str, list[dict[str, Any]], list[int]]:
    url = f"file://{tmp_path / 'bucket'}"
    stop = threading.Event()
    forged: list[int] = []
    failures: list[BaseException] = []

    def mallory() -> None:
        while not stop.is_set() and not (tmp_path / "bucket" / "manifest.json").exists():
            stop.wait(0.05)
        try:
            asyncio.run(_mallory(url, stop, forged))
        except BaseException as error:
            failures.append(error)
            raise

    thread = threading.Thread(target=mallory)
    thread.start()
    try:
        results = run_two(url, steps=160, stop=stop)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not failures
    return url, results, forged


def signer_of(data: bytes) -> str:
    return data.split(b"\n", 1)[0].split(b" ")[4].decode()


def test_a_member_cannot_commit_nor_publish_as_another_and_the_run_goes_on(
    keyed_run: tuple[str, list[dict[str, Any]], list[int]],
) -> None:
    url, results, forged = keyed_run
    for r in results:
        assert np.mean(r["losses"][-10:]) < 0.2 * np.mean(r["losses"][:10])
        assert np.abs(flat(r["model"])).max() < MALLORY / 2  # never mallory's model
    records, squatted = asyncio.run(_tape(url))
    assert len(records) >= 10
    assert squatted, f"mallory's forgeries never took a round's slot 0 (forged {forged})"
    merged = {p.learner for rec in records for p in rec.participants}
    assert merged <= {"n0", "n1"}
    details = [
        (type(e), e.detail) for r in results for e in r["events"] if "not_allowed" in e.detail
    ]
    kinds = {kind for kind, _ in details}
    assert events.RecordRejected in kinds, details
    assert any("mallory is not a closer" in d for _, d in details)
    if events.SnapshotUnauthenticated in kinds:  # when n1 was not first at the key
        assert any("not n1's" in d for _, d in details)
    # Where a closer found mallory's snapshot at n1's slot 0, it read n1's slot 1 and merged
    # it: the squat cost n1 nothing, and no event says n1 was rejected (issue 12).
    seen = {
        e.round
        for r in results
        for e in r["events"]
        if isinstance(e, events.SnapshotUnauthenticated) and "not n1's" in e.detail
    }
    by_round = {rec.round: rec for rec in records}
    seen &= set(by_round)  # (not the round the run stopped in)
    merged = {r for r in seen if "n1" in {p.learner for p in by_round[r].participants}}
    assert merged == seen, f"n1 not merged in squatted rounds {sorted(seen - merged)}"
    blamed = {
        e.round
        for r in results
        for e in r["events"]
        if isinstance(e, events.Rejected) and e.learner == "n1"
    }
    assert not blamed & merged, f"n1 named rejected in rounds it was merged in: {blamed & merged}"
    evaluator, _ = torch_model(seed=42)
    loaded = align(evaluator, mailbox=url, run_key=RUN_KEY)
    assert loaded.round == records[-1].round
    assert np.abs(flat(evaluator)).max() < MALLORY / 2
    assert main(["status", url, "--json"]) == 1  # no key in the environment: refused


async def _tape(url: str) -> tuple[list[RoundRecord], list[int]]:
    """Every record as a reader of the roster judges it, and the rounds whose slot 0 holds
    mallory's object (so their record is at a higher slot, signed by a closer)."""
    async with Mailbox.open(url) as box:
        m = await _as_mallory(box)
        records: list[RoundRecord] = []
        squatted = []
        while True:
            r = len(records)
            read = await read_record(box, m.reading, m.manifest.config, r)
            if not isinstance(read.record, RoundRecord):
                assert read.record is None, read.record
                break
            records.append(read.record)
            slot0 = await box.get(keys.round_record(r))
            assert slot0 is not None
            if signer_of(slot0.data) == "mallory":
                squatted.append(r)
                assert any("mallory is not a closer" in bad.reason for bad in read.skipped)
        return records, squatted


def test_a_forged_commit_is_skipped_and_loaded_once_the_signature_check_is_planted_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a run's last commit, mallory writes the next one: ``align()`` skips it (the
    newest commit stays the closers'); with readers skipping per-node signatures (the
    planted bug; the run key's tag still holds) the same object is the model it loads."""
    url = f"file://{tmp_path / 'bucket'}"
    model, step = torch_model(seed=0)
    with session(url, "n0", model, [], algorithm(quorum=1)) as s:
        train(s, step, 24, seed=0)
    newest = asyncio.run(_forge_after_newest(url))
    evaluator, _ = torch_model(seed=3)
    assert align(evaluator, mailbox=url, run_key=RUN_KEY).round == newest.round
    assert np.abs(flat(evaluator)).max() < MALLORY / 2
    monkeypatch.setattr(auth, "_signed", lambda signing, run_id, key, data, body: body)
    assert align(evaluator, mailbox=url, run_key=RUN_KEY).round == newest.round + 1
    assert np.isclose(flat(evaluator), MALLORY).any()


async def _forge_after_newest(url: str) -> RoundRecord:
    async with Mailbox.open(url) as box:
        m = await _as_mallory(box)
        newest = await _newest(box, m)
        assert newest is not None
        await _forge(box, m, newest)
        return newest


def test_nodes_whose_keys_do_not_fit_are_refused_by_name(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    model, _ = torch_model(seed=0)
    with session(url, "n0", model, []):
        pass
    cases = {
        "give node n1 its key": {"node": "n1", "node_key": None},
        "not n1's on the run's roster": {"node": "n1", "node_key": NODE_KEYS["n0"]},
        "would also act as closer": {"node": "mallory", "node_key": NODE_KEYS["mallory"]},
        "neither on the run's roster nor admitted": {"node": "eve", "node_key": NODE_KEYS["n0"]},
        "a node key is 64 hex characters": {"node": "n1", "node_key": "abc"},
    }
    for message, over in cases.items():
        other, _ = torch_model(seed=1)
        s = Session(
            other,
            algorithm=algorithm(),
            mailbox=url,
            options=FAST,
            run_key=RUN_KEY,
            **over,
        )
        with pytest.raises(NodeKeyError, match=message):
            s.start()
    learner, _ = torch_model(seed=1)
    s = Session(
        learner,
        algorithm=algorithm(),
        mailbox=url,
        node="mallory",
        role="learner",
        options=FAST,
        run_key=RUN_KEY,
        node_key=NODE_KEYS["mallory"],
    )
    s.start()  # a learner-only member joins
    s.close()


def test_keys_and_a_roster_from_the_command_line_create_and_guard_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = {}
    for name in ("authority", "n0"):
        assert main(["keygen", "--node"]) == 0
        out, err = capsys.readouterr()
        (tmp_path / f"{name}.key").write_text(out)
        printed[name] = err.split("public key: ")[1].split()[0]
        assert public_key(bytes.fromhex(out.strip())) == printed[name]
    argv = ["roster", "--authority-key-file", str(tmp_path / "authority.key")]
    assert main([*argv, "--member", f"n0:learner+closer:{printed['n0']}"]) == 0
    (tmp_path / "roster.json").write_text(capsys.readouterr().out)
    assert main([*argv, "--member", "n0:admin:" + printed["n0"]]) == 1
    assert "not a role" in capsys.readouterr().err

    url = f"file://{tmp_path / 'bucket'}"
    monkeypatch.setenv("GM_NODE_KEY_FILE", str(tmp_path / "n0.key"))
    monkeypatch.setenv("GM_ROSTER_FILE", str(tmp_path / "roster.json"))
    model, step = torch_model(seed=0)
    s = Session(
        model, algorithm=algorithm(quorum=1), mailbox=url, node="n0", options=FAST, run_key=RUN_KEY
    )
    with s:
        train(s, step, 16, seed=0)
    assert s.manifest is not None
    assert s.manifest.roster is not None
    assert s.manifest.roster.authority == printed["authority"]
    monkeypatch.setenv("GM_RUN_KEY", RUN_KEY.hex())
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "not_allowed" not in out
    assert f"1 members (n0:learner+closer); authority {printed['authority']}" in out
    # A node told another authority refuses the run; told this one, it joins.
    for authority, refused in ((public_key(AUTHORITY), True), (printed["authority"], False)):
        monkeypatch.setenv("GM_RUN_AUTHORITY", authority)
        other, _ = torch_model(seed=1)
        s = Session(
            other,
            algorithm=algorithm(quorum=1),
            mailbox=url,
            node="n0",
            options=FAST,
            run_key=RUN_KEY,
        )
        if refused:
            with pytest.raises(NodeKeyError, match="issued by authority"):
                s.start()
        else:
            s.start()
            s.close()


def test_a_member_cannot_write_another_nodes_resume_state(tmp_path: Path) -> None:
    url, bucket = f"file://{tmp_path / 'bucket'}", tmp_path / "bucket"
    model, step = torch_model(seed=0)
    with session(url, "n0", model, [], algorithm(quorum=1), resume={"n": 1}) as s:
        train(s, step, 16, seed=0)
    state: dict[str, Any] = {"n": 0}
    model, _ = torch_model(seed=0)
    with session(url, "n0", model, [], algorithm(quorum=1), resume=state):
        assert state == {"n": 1}  # its own state, signed by it, comes back
    manifest = asyncio.run(_manifest(url))
    run_auth = auth.derive(RUN_KEY)
    forged_state = resume.encode({"n": 666}, run=manifest.run_id, node="n0", round=0, step=1)
    mallory = signing_for(manifest, "mallory", NODE_KEYS["mallory"], ("learner",))
    key = keys.resume("n0")
    sealed = resume.seal(
        forged_state, resume.digest_key(run_auth), mallory, run=manifest.run_id, key=key
    )
    (bucket / key).write_bytes(sealed)  # the run key's digest is right: only the signer is not
    model, _ = torch_model(seed=0)
    state = {"n": 0}
    restarted = session(url, "n0", model, [], algorithm(quorum=1), resume=state)
    with pytest.raises(ResumeError, match="not signed by n0"):
        restarted.start()
    assert state == {"n": 0}


async def _manifest(url: str) -> Manifest:
    async with Mailbox.open(url) as box:
        manifest = await read_manifest(box, auth.derive(RUN_KEY))
    assert manifest is not None
    return manifest
