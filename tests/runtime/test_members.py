"""Members admitted and revoked after the manifest, with real Sessions over file://
(spec/protocol.md §16.3.3).

The manifest's roster names one node, ``n0`` (learner and closer). While it trains, the
run authority admits ``v1`` as a learner by a certificate under ``members/``: ``v1``
joins (no new manifest), and ``n0``'s closer merges its snapshots. Then the authority
revokes ``v1`` from the next round. An honest ``v1`` learns it at its next look at
``members/`` and stops by name (:class:`~gm_shell.RevokedError`). A compromised one (it
holds the run key and its node key, and runs code that does not stop: here the stop
patched out) trains on and publishes as before, and every snapshot it publishes for a
round from then on is refused by name (``revoked``) while ``n0`` commits on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from runtime_worker import torch_model
from test_session import FAST, IN, TEACHER, algorithm, flat, train

from gm_core import auth, keys
from gm_core.members import member_key
from gm_core.records import Member, Reason, RoundRecord
from gm_shell import NodeKeyError, RevokedError, Session, events
from gm_shell.cli import main
from gm_shell.mailbox import Mailbox
from gm_shell.members import MembersFullError, write
from gm_shell.nodekeys import certify, make_roster, public_key, reader, revoke
from gm_shell.run import read_manifest
from gm_shell.runtime import Runtime
from gm_shell.tapereads import read_record

RUN_KEY = bytes(range(32))
NODE_KEYS = {"n0": bytes([1]) * 32, "v1": bytes([2]) * 32}
AUTHORITY = bytes([9]) * 32
ROSTER = make_roster(
    AUTHORITY,
    [Member(node="n0", roles=("learner", "closer"), public_key=public_key(NODE_KEYS["n0"]))],
)
OPTIONS = attrs.evolve(FAST, members_poll_s=0.1)


def _session(url: str, node: str, model: Any, got: list[events.Event], **over: Any) -> Session:
    return Session(
        model,
        algorithm=algorithm(quorum=1),
        mailbox=url,
        node=node,
        options=OPTIONS,
        run_key=RUN_KEY,
        node_key=NODE_KEYS[node],
        roster=ROSTER,
        callbacks=[got.append],
        **over,
    )


async def _authority(url: str, word: Any) -> str:
    """Write the authority's ``word`` (made for the run's id) under ``members/``."""
    async with Mailbox.open(url) as box:
        manifest = await read_manifest(box, auth.derive(RUN_KEY))
        assert manifest is not None
        envelope = auth.of_run(manifest, reader(auth.derive(RUN_KEY), manifest))
        return await write(box, envelope, word(manifest.run_id))


def _collecting_when_learned(got: list[events.Event], member: str) -> int:
    """The round a node's closer was collecting when it learned ``member``'s revocation:
    the one after the last it committed before (its events come in order)."""
    committed = -1
    for event in got:
        if isinstance(event, events.MemberLearned) and event.revoked and event.member == member:
            return committed + 1
        if isinstance(event, events.Committed):
            committed = event.round
    raise AssertionError(f"the node never learned {member}'s revocation")


async def _tape(url: str) -> list[RoundRecord]:
    async with Mailbox.open(url) as box:
        run_auth = auth.derive(RUN_KEY)
        manifest = await read_manifest(box, run_auth)
        assert manifest is not None
        envelope = auth.of_run(manifest, reader(run_auth, manifest))
        records: list[RoundRecord] = []
        while True:
            read = await read_record(box, envelope, manifest.config, len(records))
            if not isinstance(read.record, RoundRecord):
                return records
            records.append(read.record)


def _until(what: Any, timeout_s: float = 120.0) -> Any:
    """Poll ``what()`` until it returns something true (the run is real: it takes time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what.__doc__}")


def _train(
    session: Session, step: Any, stop: threading.Event, seed: int, out: dict[str, Any]
) -> None:
    rng = np.random.default_rng(seed)
    try:
        with session:
            while not stop.is_set():
                x = rng.normal(size=(32, IN)).astype(np.float32)
                out.setdefault("losses", []).append(step(x, x @ TEACHER))
                session.step(samples=32)
    except Exception as error:  # the test judges it (a revoked node stops by raising)
        out["error"] = error


@pytest.mark.parametrize("compromised", [False, True])
def test_a_certified_learner_joins_and_once_revoked_stops_or_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compromised: bool
) -> None:
    if compromised:  # v1 runs code that does not stop (n0 is never revoked: it is unaffected)
        monkeypatch.setattr(Runtime, "_stop_if_revoked", lambda self, signing: None)
    url = f"file://{tmp_path / 'bucket'}"
    stop = threading.Event()
    got: dict[str, list[events.Event]] = {"n0": [], "v1": []}
    out: dict[str, dict[str, Any]] = {"n0": {}, "v1": {}}
    model0, step0 = torch_model(seed=0)
    n0 = threading.Thread(
        target=_train, args=(_session(url, "n0", model0, got["n0"]), step0, stop, 0, out["n0"])
    )
    threads = [n0]
    n0.start()
    try:
        _until(lambda: (tmp_path / "bucket" / "manifest.json").exists())
        model1, step1 = torch_model(seed=1)
        v1 = _session(url, "v1", model1, got["v1"], role="learner")
        with pytest.raises(NodeKeyError, match="nor admitted under members/"):
            v1.start()  # not yet admitted
        member = Member(node="v1", roles=("learner",), public_key=public_key(NODE_KEYS["v1"]))
        asyncio.run(_authority(url, lambda run: certify(AUTHORITY, run, member)))
        closer = Member(node="v1c", roles=("learner", "closer"), public_key=member.public_key)
        asyncio.run(_authority(url, lambda run: certify(AUTHORITY, run, closer)))
        model1, step1 = torch_model(seed=1)
        v1 = _session(url, "v1", model1, got["v1"], role="learner")
        threads.append(threading.Thread(target=_train, args=(v1, step1, stop, 1, out["v1"])))
        threads[-1].start()

        def merged_v1() -> list[RoundRecord]:
            """a record that merged v1's snapshot"""
            tape = asyncio.run(_tape(url))
            return [r for r in tape if any(p.learner == "v1" for p in r.participants)]

        admitted = _until(merged_v1)[0]
        newest = asyncio.run(_tape(url))[-1].round
        revoked_from = newest + 2  # ahead of the tape, as gm roster revoke
        asyncio.run(_authority(url, lambda run: revoke(AUTHORITY, run, "v1", revoked_from, "test")))

        def stopped_v1() -> bool:
            """v1 to stop"""
            return not threads[1].is_alive()

        def rejected_v1() -> list[RoundRecord]:
            """three records that refused v1 since its revocation"""
            tape = asyncio.run(_tape(url))
            refused = [
                r
                for r in tape
                if r.round >= revoked_from
                and any(
                    x.learner == "v1" and x.reason is Reason.UNAUTHENTICATED for x in r.rejections
                )
            ]
            return refused if len(refused) >= 3 else []

        if compromised:
            _until(rejected_v1)
        else:
            _until(stopped_v1)
            newest = asyncio.run(_tape(url))[-1].round
            _until(lambda: asyncio.run(_tape(url))[-1].round >= newest + 3)  # n0 goes on
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    tape = asyncio.run(_tape(url))
    assert admitted.round < revoked_from
    assert "error" not in out["n0"], out["n0"]
    if not compromised:
        # Stopped by name, having learned its own revocation; nothing of it after the round.
        error = out["v1"]["error"]
        assert isinstance(error.__cause__, RevokedError), error
        assert f"v1 was revoked by the run authority from round {revoked_from}" in str(
            error.__cause__
        )
        own = [e for e in got["v1"] if isinstance(e, events.MemberLearned) and e.revoked]
        assert [e.member for e in own] == ["v1"]
        # What §16.3.3 promises: every round n0 began collecting after it learned the
        # revocation refuses v1. The round it was collecting then may merge it (a CI run
        # at load merged v1 in round r0 itself: n0 learned it while collecting r0).
        began_after = max(revoked_from, _collecting_when_learned(got["n0"], "v1") + 1)
        assert not [
            r for r in tape if r.round >= began_after for p in r.participants if p.learner == "v1"
        ]
        return
    assert "error" not in out["v1"], out["v1"]
    assert tape[-1].round >= revoked_from + 3  # the run trained on
    learned = [e for e in got["n0"] if isinstance(e, events.MemberLearned)]
    assert any(e.member == "v1" and not e.revoked for e in learned)
    (revocation,) = [e for e in learned if e.member == "v1" and e.revoked]
    assert revocation.round == revoked_from
    # Every round n0 began to collect once it knew, from the revocation's round on, refused
    # v1 (the round it was collecting when it learned may hold v1's snapshot, judged before).
    closed_since = sorted(
        e.round
        for e in got["n0"]
        if isinstance(e, events.Committed) and e.at_s > revocation.at_s and e.round >= revoked_from
    )[1:]
    assert len(closed_since) >= 2
    for record in tape:
        if record.round in closed_since:
            assert all(p.learner != "v1" for p in record.participants), record.round
    said = [e for e in got["n0"] if isinstance(e, events.SnapshotUnauthenticated)]
    assert any("revoked: " in e.detail and "v1 is revoked from round" in e.detail for e in said)
    refused = [e for e in got["n0"] if isinstance(e, events.MemberRefused)]
    assert any("v1c: a certificate admits learners only" in e.detail for e in refused)
    assert np.isfinite(flat(model0)).all()
    assert np.mean(out["n0"]["losses"][-10:]) < 0.5 * np.mean(out["n0"]["losses"][:10])


def test_the_authority_writes_past_garbage_and_no_further_than_the_slots(tmp_path: Path) -> None:
    """Garbage at a member's slot costs the authority one slot; sixteen of them, the member."""
    url = f"file://{tmp_path / 'bucket'}"
    model, _ = torch_model(seed=0)
    with _session(url, "n0", model, []):
        pass
    member = Member(node="v1", roles=("learner",), public_key=public_key(NODE_KEYS["v1"]))

    async def squat(slots: range) -> None:
        async with Mailbox.open(url) as box:
            manifest = await read_manifest(box, auth.derive(RUN_KEY))
            assert manifest is not None
            envelope = auth.of_run(manifest, reader(auth.derive(RUN_KEY), manifest))
            for slot in slots:
                await box.put_once(member_key(envelope, "v1", slot), b"garbage")

    asyncio.run(squat(range(2)))
    key = asyncio.run(_authority(url, lambda run: certify(AUTHORITY, run, member)))
    assert keys.parse(key) == keys.MemberKey("v1", key.split("/")[2][:-5])
    v1_model, _ = torch_model(seed=1)
    got: list[events.Event] = []
    with _session(url, "v1", v1_model, got, role="learner"):
        pass
    assert sum(isinstance(e, events.MemberRefused) for e in got) == 2
    asyncio.run(squat(range(16)))
    with pytest.raises(MembersFullError):
        asyncio.run(_authority(url, lambda run: revoke(AUTHORITY, run, "v1", 5, "")))


def test_the_command_line_admits_and_revokes_and_status_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    model, step = torch_model(seed=0)
    with _session(url, "n0", model, []) as s:
        train(s, step, 16, seed=0)
    authority = tmp_path / "authority.key"
    authority.write_text(AUTHORITY.hex())
    other = tmp_path / "other.key"
    other.write_text((b"\x05" * 32).hex())
    v1 = public_key(NODE_KEYS["v1"])
    add = ["roster", "add", url, "--authority-key-file", str(authority)]
    assert main([*add, "--member", f"v1:learner:{v1}"]) == 1  # no run key in the environment
    assert "members need a run key" in capsys.readouterr().err
    monkeypatch.setenv("GM_RUN_KEY", RUN_KEY.hex())
    assert main([*add, "--member", f"v1:learner+closer:{v1}"]) == 1
    assert "learners only" in capsys.readouterr().err
    wrong = ["roster", "add", url, "--authority-key-file", str(other)]
    assert main([*wrong, "--member", f"v1:learner:{v1}"]) == 1
    assert "not the run's authority" in capsys.readouterr().err
    assert main([*add, "--member", f"v1:learner:{v1}"]) == 0
    assert "admitted v1 as learner: members/v1/" in capsys.readouterr().out
    model, _ = torch_model(seed=1)
    with _session(url, "v1", model, [], role="learner"):
        pass  # admitted: it joins (no closer runs now to train with)
    revoke = ["roster", "revoke", url, "--authority-key-file", str(authority), "--node", "v1"]
    assert main([*revoke, "--from-round", "0"]) == 1
    assert "the tape already holds round" in capsys.readouterr().err
    assert main([*revoke, "--reason", "left"]) == 0
    said = capsys.readouterr().out
    assert "revoked v1 from round" in said
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "2 members (n0:learner+closer, v1:learner)" in out
    assert "1 admitted under members/" in out
    assert f"revoked: v1 from round {said.split('from round ')[1].split(':')[0]}" in out
    model, _ = torch_model(seed=1)
    with pytest.raises(NodeKeyError, match="v1 is revoked from round"):
        _session(url, "v1", model, [], role="learner").start()
