"""SIGTERM to the demo's launcher stops its learners, and they leave the run: none trains on.

A real ``gm demo --tiny`` (2 learner processes and the baseline, a ``file://``
mailbox, far more steps than the test waits for) runs as a process. Once both
learners hold their leases, the test sends SIGTERM to the launcher alone, as a
scheduler or ``kill`` does. The launcher must exit with status 143 after stopping
every worker it started (none is left running), and the learners must have
deleted their leases on the way out (a learner killed with SIGKILL cannot), so
peers never wait a lease timeout for them. Before, SIGTERM's default action killed
the launcher at once and its learners trained on, holding their leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gm_core import keys
from gm_shell.demo import layout
from gm_shell.leaving import EXIT_ON_SIGTERM

START_S = 600.0
"""How long the learners may take to start on a loaded machine (torch imports, the corpus)."""


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux: its main thread's children)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_the_launcher_stops_its_learners_and_they_leave(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "gm_shell", "demo", "--tiny", "--learners", "2"]
    argv += ["--steps", "100000", "--runs", str(tmp_path), "--name", "run"]
    with (tmp_path / "launcher.log").open("wb") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    leases = tmp_path / "run" / "mailbox"
    learners = [layout.learner_name(k) for k in range(2)]
    workers: list[int] = []
    try:
        deadline = time.monotonic() + START_S
        while not all((leases / keys.lease(n)).exists() for n in learners):
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the learners never joined"
            time.sleep(0.2)
        workers = children(launcher.pid)
        assert len(workers) == 3  # two learners and the baseline
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=300) == EXIT_ON_SIGTERM
        assert [w for w in workers if alive(w)] == []  # stopped and reaped by the launcher
        assert [n for n in learners if (leases / keys.lease(n)).exists()] == []
    finally:
        for pid in [launcher.pid, *workers]:  # only what this test started, if left over
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=60)
