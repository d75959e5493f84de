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
        # A learner that closes while the other has left may see its last rounds
        # uncommitted when its close wait runs out (quorum 2): up to a gap per fragment.
        assert STEPS // 2 <= steps <= STEPS


def run_resumed(kind: str, url: str, steps: int) -> list[int]:
    """One node ``n0`` with ``resume=True`` to ``steps``: what its ``resumed`` line says."""
    argv = [sys.executable, str(WORKER), kind, url, "n0", str(steps), "resume"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("resumed "))
    return [int(v) for v in line.split()[1:]]


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_a_trainer_node_restarted_with_resume_goes_on_from_its_step_and_optimizer(
    kind: str, tmp_path: Path
) -> None:
    """The node trains half the steps and stops; started again with the same id and the
    full ``max_steps`` it begins at its saved step and takes only the rest, with its
    optimizer (Adam's step) and LR schedule where they were. Lightning's run counts
    tokens (its batches' elements), which it could not before."""
    url = f"file://{tmp_path / 'run'}"
    half = STEPS // 2
    # began, optimizer steps taken, Session.step_count, Adam's step, the schedule's step
    assert run_resumed(kind, url, half) == [0, half, half, half, half]
    assert run_resumed(kind, url, STEPS) == [half, half, STEPS, STEPS, STEPS]

    async def status() -> object:
        with Mailbox.open(url) as box:
            return await gather_status(box, everything=True)

    s = asyncio.run(status())
    assert s.config.unit == "tokens"  # type: ignore[attr-defined]
    window = s.window  # type: ignore[attr-defined]
    (learner,) = window.learners
    per_step = BATCH * SEQUENCE if kind == "hf" else BATCH * 8
    assert learner.steps == STEPS, learner  # every step of both lives committed, once
    assert learner.tokens == per_step * STEPS, learner
