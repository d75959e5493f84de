"""Wire format 2's body number and ``gm migrate`` (spec/protocol.md §16.7), on file://.

OLD is the tape format-1 gm wrote (``tests/fixtures/format1/run``, see
test_format1_run.py). ``gm migrate OLD NEW`` creates at NEW an authenticated format-2 run
whose initial parameters are exactly what ``align()`` loads from OLD, with OLD's outer
momentum (read from OLD's payloads, re-written under NEW's keyed digests) and OLD's roster
when it has one; a node of today trains NEW on, and every object it writes is a ``gm/2``
envelope whose body declares format 2. A format-1 object at NEW's next round key (bare,
as format-1 gm wrote it, or tagged with the run key but declaring format 1) is refused by
name (``wrong_format``) and the round's record lands at the next slot.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_format1_run import FIXTURE, OLD_CONFIG, model

from gm_core import auth, codec, keys
from gm_core.records import FORMAT_2, Manifest, Member, PayloadRef, RoundRecord
from gm_core.tape import record_key
from gm_shell import Session, align, events
from gm_shell.cli import main
from gm_shell.mailbox import Mailbox
from gm_shell.run import read_manifest
from gm_shell.tapereads import read_record

RUN_KEY = bytes(range(32))


def _train(url: str, got: list[events.Event], steps: int = 32) -> torch.nn.Module:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x.sum(dim=1, keepdim=True)
    with Session(
        net,
        algorithm=OLD_CONFIG,
        mailbox=url,
        node="new-node",
        run_key=RUN_KEY,
        callbacks=[got.append],
    ) as s:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step(samples=8)
    return net


def _flat(net: torch.nn.Module) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])


async def _tape(url: str) -> tuple[list[RoundRecord], list[list[str]]]:
    """NEW's records as a reader judges them, and the reasons of the slots each skipped."""
    async with Mailbox.open(url) as box:
        manifest = await read_manifest(box, auth.derive(RUN_KEY))
        assert manifest is not None
        envelope = auth.of_run(manifest, auth.derive(RUN_KEY))
        records, skipped = [], []
        while True:
            read = await read_record(box, envelope, manifest.config, len(records))
            if not isinstance(read.record, RoundRecord):
                return records, skipped
            records.append(read.record)
            skipped.append([bad.reason for bad in read.skipped])


async def _plant(url: str, bucket: Path, old: Path) -> int:
    """Format-1 objects at slots 0 and 1 of NEW's next round: OLD's record of that round
    as format-1 gm wrote it, and the same body tagged with the run key."""
    records, _ = await _tape(url)
    target = len(records)
    async with Mailbox.open(url) as box:
        manifest = await read_manifest(box, auth.derive(RUN_KEY))
        assert manifest is not None
        envelope = auth.of_run(manifest, auth.derive(RUN_KEY))
    body = (old / keys.round_record(target)).read_bytes()
    assert body.startswith(b"{")
    assert codec.declared_format(body) == 1
    (bucket / keys.round_record(target)).write_bytes(body)
    slot1 = record_key(envelope, target, 1)
    (bucket / slot1).parent.mkdir(parents=True, exist_ok=True)
    (bucket / slot1).write_bytes(envelope.seal(slot1, body))
    return target


def test_migrate_carries_a_format_1_tape_into_a_format_2_run_that_trains_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old_dir = tmp_path / "old"
    shutil.copytree(FIXTURE / "run", old_dir)
    old, new, bucket = f"file://{old_dir}", f"file://{tmp_path / 'new'}", tmp_path / "new"
    before = {p: p.read_bytes() for p in old_dir.rglob("*") if p.is_file()}
    assert main(["migrate", old, new]) == 1
    assert "a format-2 run is authenticated" in capsys.readouterr().err
    monkeypatch.setenv("GM_RUN_KEY", RUN_KEY.hex())
    assert main(["migrate", old, new, "--run-id", "carried"]) == 0
    said = capsys.readouterr().out
    assert "created run carried (format 2" in said
    assert "from round 15 of" in said
    assert main(["migrate", old, new]) == 1
    assert "a run is already there" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in old_dir.rglob("*") if p.is_file()} == before  # read only

    stored = (bucket / keys.manifest()).read_bytes()
    assert stored.startswith(auth.MARKER)
    assert codec.declared_format(stored.split(b"\n", 1)[1]) == FORMAT_2
    carried = codec.decode(Manifest, stored.split(b"\n", 1)[1])
    newest = codec.decode(RoundRecord, (old_dir / keys.round_record(15)).read_bytes())
    assert [s.version for s in carried.init] == [0] * len(newest.frontier)  # NEW's own count
    for fragment, (was, now) in enumerate(zip(newest.frontier, carried.init, strict=True)):
        assert was.momentum is not None
        assert now.momentum is not None
        assert now.momentum.key != was.momentum.key  # re-written under NEW's keyed digest
        np.testing.assert_array_equal(
            _payload(old_dir, None, fragment, was.momentum, carried),
            _payload(bucket, RUN_KEY, fragment, now.momentum, carried),
        )
    from_old, from_new = model(), model()
    align(from_old, mailbox=old, run_key=None)
    assert align(from_new, mailbox=new, run_key=RUN_KEY).round == -1  # its initial state
    np.testing.assert_array_equal(_flat(from_new), _flat(from_old))
    expected = np.load(FIXTURE / "expected.npz")
    for name, value in from_new.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), expected[name])

    assert main(["status", new]) == 0
    assert "wire format 2" in capsys.readouterr().out
    got: list[events.Event] = []
    _train(new, got)
    records, _ = asyncio.run(_tape(new))
    assert len(records) >= 4
    for r in range(len(records)):
        data = (bucket / keys.round_record(r)).read_bytes()
        assert data.startswith(auth.MARKER)
        assert codec.declared_format(data.split(b"\n", 1)[1]) == FORMAT_2

    target = asyncio.run(_plant(new, bucket, old_dir))
    got = []
    net = _train(new, got)
    records, skipped = asyncio.run(_tape(new))
    assert len(records) > target + 2, "the run commits past the planted round"
    assert len(skipped[target]) == 2
    assert "wrong_format" in skipped[target][0]
    assert "a format 1 object in a format 2 run (it carries no tag)" in skipped[target][0]
    assert "a format 1 object in a format 2 run" in skipped[target][1]
    refused = [e.detail for e in got if isinstance(e, events.RecordRejected)]
    assert any("wrong_format" in d for d in refused), refused
    assert all(torch.isfinite(p).all() for p in net.parameters())


def _payload(
    bucket: Path, run_key: bytes | None, fragment: int, ref: PayloadRef, manifest: Manifest
) -> np.ndarray:
    """The momentum payload ``ref`` of ``fragment`` decoded, its digest checked."""
    from gm_shell.fragments import FragmentCodec, Role, payload_key

    run_auth = None if run_key is None else auth.derive(run_key)
    fragments = FragmentCodec(manifest, payload_key=payload_key(run_auth))
    data = (bucket / ref.key).read_bytes()
    fragments.check(ref, data)
    return fragments.decode(fragment, Role.MOMENTUM, data)


def test_migrate_carries_the_roster_unless_given_another(tmp_path: Path) -> None:
    """OLD's per-node keys go with it: migrating a run that has a roster (here a run that
    was itself migrated with one) gives NEW the same roster, the authority's signature
    still good (it covers the members, not the run)."""
    from gm_shell.migrate import migrate
    from gm_shell.nodekeys import make_roster, public_key

    roster = make_roster(
        bytes([9]) * 32,
        [Member(node="n0", roles=("learner", "closer"), public_key=public_key(bytes([1]) * 32))],
    )
    old_dir = tmp_path / "old"
    shutil.copytree(FIXTURE / "run", old_dir)
    run_auth = auth.derive(RUN_KEY)

    async def carry(source: str, target: str, **given: object) -> Manifest:
        async with Mailbox.open(source) as old, Mailbox.open(target) as new:
            old_auth = None if source.endswith("/old") else run_auth
            done = await migrate(old, new, run_auth, old_auth=old_auth, **given)  # type: ignore[arg-type]
            return done.manifest

    mid = asyncio.run(carry(f"file://{old_dir}", f"file://{tmp_path / 'mid'}", roster=roster))
    assert mid.roster == roster
    last = asyncio.run(carry(f"file://{tmp_path / 'mid'}", f"file://{tmp_path / 'last'}"))
    assert last.roster == roster
    assert all(s.momentum is not None for s in last.init)
