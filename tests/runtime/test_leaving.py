"""A learner that stops without ``close()`` still releases its lease: peers never wait for it.

The leaver is a real process (``leaver.py``) that creates the run, and so is its
first closer. The survivor trains in this process with ``quorum=2`` and a lease
timeout and takeover floor of ten minutes: while the leaver's lease is in the
bucket, every round waits for the leaver's snapshot and no follower takes over,
so the survivor would stall (``StalledError`` after ``stall_timeout_s``). It
finishes only because the leaver's exit — an exception out of a loop with no
``with`` block, one out of a ``with`` block, or SIGTERM — deleted the lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_harness import wait_until
from runtime_worker import IN, TEACHER, torch_model

from gm_core import keys
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.leaving import EXIT_ON_SIGTERM

HERE = Path(__file__).parent
PATIENT = {
    "sync_every": 8,
    "fragments": 2,
    "quorum": 2,
    "in_flight": 1,
    "lease_timeout_s": 600.0,
    "takeover_floor_s": 600.0,
}
OPTIONS = {"poll_s": 0.05, "renew_s": 0.3, "stall_timeout_s": 60.0, "join_timeout_s": 60.0}


def start_leaver(url: str, out: Path, mode: str) -> subprocess.Popen[bytes]:
    spec = {
        "url": url,
        "node": "leaver",
        "mode": mode,
        "go_steps": 30,
        "algorithm": PATIENT,
        "options": OPTIONS,
        "out": str(out),
    }
    log = (out / "leaver.log").open("wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    argv = [sys.executable, str(HERE / "leaver.py"), json.dumps(spec)]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.parametrize("mode", ["raise", "with-raise", "sigterm"])
def test_a_learner_that_leaves_badly_releases_its_lease(tmp_path: Path, mode: str) -> None:
    bucket = tmp_path / "bucket"
    url = f"file://{bucket}"
    leaver = start_leaver(url, tmp_path, mode)
    try:
        wait_until("the leaver to create the run", lambda: (tmp_path / "started").exists(), 60)
        survivor_steps = train_survivor(url, tmp_path, leaver)
    finally:
        if leaver.poll() is None:
            leaver.kill()
        leaver.wait(10)
    log = (tmp_path / "leaver.log").read_text(errors="replace")[-3000:]
    expected = EXIT_ON_SIGTERM if mode == "sigterm" else 1
    assert leaver.returncode == expected, log
    assert not (bucket / keys.lease("leaver")).exists(), log
    rounds = [json.loads(p.read_text()) for p in sorted((bucket / "rounds").glob("*.json"))]
    with_both = [r["round"] for r in rounds if len(r["participants"]) == 2]
    assert with_both, "the leaver never took part: the survivor had nothing to wait for"
    after = [r for r in rounds if r["round"] > with_both[-1]]
    assert after, "no round closed after the leaver left"
    assert survivor_steps >= 40


def train_survivor(url: str, out: Path, leaver: subprocess.Popen[bytes]) -> int:
    """Train until the leaver has gone, then 40 steps more; raises StalledError if it cannot."""
    model, train = torch_model(seed=6)
    rng = np.random.default_rng(6)
    steps, since_gone, signalled = 0, 0, False
    session = Session(
        model,
        algorithm=DiLoCo(**PATIENT),
        mailbox=url,
        node="survivor",
        options=SessionOptions(**OPTIONS),
    )
    with session:
        while since_gone < 40:
            x = rng.normal(size=(32, IN)).astype(np.float32)
            train(x, x @ TEACHER)
            session.step(samples=32)
            steps += 1
            if steps == 20:
                (out / "go").write_text("go")
            if not signalled and (out / "ready").exists():
                leaver.send_signal(signal.SIGTERM)  # once: a second one is the default action
                signalled = True
            if leaver.poll() is not None:
                since_gone += 1
            assert steps < 20_000, "the leaver never left"
    return since_gone
