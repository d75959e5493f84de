"""The Hugging Face Trainer and Lightning callbacks each drive a real 2-node run.

Two processes per framework, each a Trainer with the gm callback, train one run
through a ``file://`` folder (nothing is downloaded: the GPT-2 is built from a
tiny config). The tape must show both learners in the one run's rounds, credited
with the steps each Trainer took (under load one may finish before the other
joins, so the rounds need not merge both).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from integration_worker import BATCH, SEQUENCE

from gm_shell.mailbox import Mailbox
from gm_shell.status import gather_status

WORKER = Path(__file__).with_name("integration_worker.py")
STEPS = 24


def run_two(kind: str, folder: Path) -> list[str]:
    url = f"file://{folder}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), kind, url, node, str(STEPS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in ("n0", "n1")
    ]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return outs


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_a_trainer_callback_drives_a_two_node_run(kind: str, tmp_path: Path) -> None:
    outs = run_two(kind, tmp_path / "run")
    assert [out.strip().splitlines()[-1].split()[:2] for out in outs] == [
        ["done", "n0"],
        ["done", "n1"],
    ]

    async def status() -> object:
        with Mailbox.open(f"file://{tmp_path / 'run'}") as box:
            return await gather_status(box, everything=True)

    s = asyncio.run(status())
    window = s.window  # type: ignore[attr-defined]
    assert window is not None
    assert s.created_by in {"n0", "n1"}  # type: ignore[attr-defined]  # one run, two nodes
    credited = {t.learner: t.steps for t in window.learners}
    assert set(credited) == {"n0", "n1"}
    # The Trainer's run counts tokens (its GPT-2's sequences), Lightning's samples.
    per_step = BATCH * SEQUENCE if kind == "hf" else BATCH
    assert s.config.unit == ("tokens" if kind == "hf" else "samples")  # type: ignore[attr-defined]
    for t in window.learners:
        assert abs(t.tokens - per_step * t.steps) <= per_step, t  # both rounded over P
    for steps in credited.values():  # optimizer steps counted once (P times would be 48)
        # The final flush skips a fragment whose previous round is still open, so the
        # last few steps may never reach a commit (up to a gap per fragment in flight).
        assert STEPS // 2 <= steps <= STEPS
