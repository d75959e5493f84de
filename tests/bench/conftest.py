"""How the bench smoke tests run a benchmark script: in a child process, figures as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_bench(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """Runs ``python <args> --json FILE`` in the repository root (this worktree's ``src``
    first on the path) and returns the figures it wrote; fails on a non-zero exit."""

    def run(*args: str) -> dict[str, Any]:
        out = tmp_path / "figures.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.run(
            [sys.executable, *args, "--json", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures

    return run
