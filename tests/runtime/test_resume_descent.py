"""A resumed node checks that the tape descends from what it adopted (spec/protocol.md §16.5.2).

Real Sessions over a real file:// bucket. A node trains with ``resume=`` and closes; its
saved state names the round and digest of the newest record it had adopted. While it
is away another node trains the run on, and the resumed node reads the tape back from
the tip it joins to that record (one GET per round missed) and trains on. If instead
the record it adopted was replaced while it was away (an overwrite: the deletion class
of threat-model.md §2.1, which a chained tape detects but cannot prevent in an open run)
the node refuses to resume by name before it trains — where without the check it
would have trained on, on a tape that is not the one it left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from runtime_worker import torch_model
from test_session import FAST, algorithm, train

from gm_core import codec, keys
from gm_core.records import RoundRecord
from gm_shell import NotDescendedError, Session
from gm_shell.resume import decode
from gm_shell.session import Session as SessionClass


def node(url: str, name: str, state: dict[str, Any] | None) -> tuple[Session, Any]:
    model, step = torch_model(seed=0)
    session = Session(
        model, algorithm=algorithm(quorum=1), mailbox=url, node=name, options=FAST, resume=state
    )
    return session, step


def saved_adopted(bucket: Path, name: str) -> tuple[int, str]:
    run = json.loads((bucket / keys.manifest()).read_text())["run_id"]
    saved = decode((bucket / keys.resume(name)).read_bytes(), run=run, node=name, key="k")
    assert saved.adopted is not None
    return saved.adopted


def test_a_resumed_node_reads_the_tape_back_to_the_record_it_adopted(tmp_path: Path) -> None:
    url, bucket = f"file://{tmp_path / 'bucket'}", tmp_path / "bucket"
    session, step = node(url, "victim", {"n": 1})
    with session:
        train(session, step, 24, seed=0)
    since, _ = saved_adopted(bucket, "victim")
    other, other_step = node(url, "other", None)
    with other:
        train(other, other_step, 24, seed=1)  # the run goes on without the victim
    session, step = node(url, "victim", {"n": 1})
    with session:
        assert session.round > since  # it joined past what it had adopted, and checked back
        train(session, step, 8, seed=2)


def test_a_replaced_record_is_refused_by_name_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bucket = f"file://{tmp_path / 'bucket'}", tmp_path / "bucket"
    session, step = node(url, "victim", {"n": 1})
    with session:
        train(session, step, 24, seed=0)
    since, digest = saved_adopted(bucket, "victim")
    path = bucket / keys.round_record(since)
    record = codec.decode(RoundRecord, path.read_bytes())
    # Overwritten while the node was away: the same round, chaining to the same record
    # before it, plausible, one timing different. Its readers cannot tell; the node can.
    path.write_bytes(codec.encode(attrs.evolve(record, grace_s=record.grace_s + 0.125)))
    session, _ = node(url, "victim", {"n": 1})
    with pytest.raises(NotDescendedError, match=f"round {since}'s record is not the one"):
        session.start()
    assert saved_adopted(bucket, "victim") == (since, digest)  # nothing saved over it

    # Without the check the same restart trains on, on the replaced record.
    monkeypatch.setattr(SessionClass, "_check_descent", lambda self, saved: None)
    session, step = node(url, "victim", {"n": 1})
    with session:
        train(session, step, 4, seed=3)
