"""A run written by format-1 gm (before wire format 2) is read and carried on by today's gm.

spec/protocol.md §16.7: format-1 tapes are read (``gm status``, ``align()``) and a node
of today joins a format-1 run as an open run. ``tests/fixtures/format1/run`` was written
by gm at commit fecb301 (the last before the trust-boundary work) with
``tests/fixtures/format1/make_run.py``: one node, a tiny torch model, 16 rounds; the
parameters that gm's ``align()`` loaded are in ``expected.npz``. No old code runs here.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gm_core import codec
from gm_core.records import RoundRecord
from gm_shell import DiLoCo, RunMismatchError, Session, align
from gm_shell.mailbox import Mailbox
from gm_shell.status import RunStatus, gather_status

FIXTURE = Path(__file__).parent.parent / "fixtures" / "format1"
ROUNDS = 16
"""Records the old node wrote (rounds 0-15)."""
OLD_CONFIG = DiLoCo(sync_every=8, fragments=2, quorum=1, max_share=None)
"""The old run's config. A joiner must match it, and today's default share cap (2.0)
came after it: with defaults the join is refused, naming ``config.max_share``."""


def model() -> torch.nn.Module:
    """The fixture's model shape (its values are replaced by what the run committed)."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def copied(tmp_path: Path) -> str:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    return f"file://{run}"


def status(url: str) -> RunStatus:
    async def go() -> RunStatus:
        with Mailbox.open(url) as box:
            return await gather_status(box, everything=True)

    return asyncio.run(go())


def tape(folder: Path) -> list[RoundRecord]:
    return [codec.decode(RoundRecord, p.read_bytes()) for p in sorted(folder.glob("rounds/*"))]


def test_align_loads_exactly_what_format_1_gm_loaded(tmp_path: Path) -> None:
    net = model()
    align(net, mailbox=copied(tmp_path))
    expected = np.load(FIXTURE / "expected.npz")
    state = net.state_dict()
    assert sorted(expected.files) == sorted(state)
    for name in expected.files:
        np.testing.assert_array_equal(state[name].numpy(), expected[name])


def test_status_reads_the_whole_format_1_tape(tmp_path: Path) -> None:
    got = status(copied(tmp_path))
    assert got.rounds == ROUNDS
    assert got.created_by == "old-node"
    assert got.auth == "open"
    assert not got.unreadable, got.unreadable


def test_a_node_of_today_carries_the_format_1_run_on(tmp_path: Path) -> None:
    url = copied(tmp_path)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x.sum(dim=1, keepdim=True)
    with Session(net, algorithm=OLD_CONFIG, mailbox=url, node="new-node") as s:
        for _ in range(32):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step(samples=8)
    records = tape(tmp_path / "run")
    assert [r.round for r in records] == list(range(len(records)))
    added = records[ROUNDS:]
    assert len(added) >= 4, "today's node commits on the old tape"
    assert any(p.learner == "new-node" for r in added for p in r.participants)
    assert all(torch.isfinite(p).all() for p in net.parameters())


def test_with_today_s_defaults_the_join_is_refused_by_the_field_that_differs(
    tmp_path: Path,
) -> None:
    defaults = DiLoCo(sync_every=8, fragments=2, quorum=1)
    with (
        pytest.raises(RunMismatchError, match=r"config\.max_share"),
        Session(model(), algorithm=defaults, mailbox=copied(tmp_path), node="new-node"),
    ):
        pass
