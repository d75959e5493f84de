"""What the multi-process runtime tests share: a worker script run in an interpreter of its
own, the lines it traces, and waits bounded by one deadline that fail at once when a process
that must stay up has exited (its output is then in the failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def spawn(worker: str, spec: Mapping[str, Any]) -> subprocess.Popen[str]:
    """``python {worker} {spec as JSON}`` from this folder, its output piped."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.Popen(
        [sys.executable, str(HERE / worker), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def traced(path: Path) -> list[str]:
    """The lines a worker has traced so far (none before its first)."""
    return path.read_text().splitlines() if path.exists() else []


class Deadline:
    """One time limit for a test's waits, on this process's monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.at_s = time.monotonic() + seconds

    def wait(
        self,
        what: str,
        ready: Callable[[], bool],
        *,
        alive: Iterable[subprocess.Popen[str]] = (),
        every_s: float = 0.02,
    ) -> None:
        """Until ``ready()``; fails naming ``what`` past the deadline, or with the output
        of an ``alive`` process that has exited meanwhile."""
        watched = list(alive)
        while not ready():
            assert time.monotonic() < self.at_s, what
            for proc in watched:
                assert proc.poll() is None, (what, proc.communicate())
            time.sleep(every_s)


def result(name: str, proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The JSON line a worker printed last, once it has exited 0."""
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, (name, err[-3000:])
    found: dict[str, Any] = json.loads(out.splitlines()[-1])
    return found
