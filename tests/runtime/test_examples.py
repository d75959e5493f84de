"""The examples run as documented: a torch node and an MLX node share one run and finish."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(script: str, url: str, node: str, steps: int) -> subprocess.Popen[str]:
    argv = [sys.executable, str(EXAMPLES / script), "--mailbox", url, "--node", node]
    argv += ["--steps", str(steps), "--sync-every", "40"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_torch_and_mlx_examples_share_a_run(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    torch_node = start("torch_learner.py", url, "alice", 600)
    mlx_node = start("mlx_learner.py", url, "carol", 300)
    mlx_out = mlx_node.communicate(timeout=240)[0]
    torch_out = torch_node.communicate(timeout=240)[0]
    assert mlx_node.returncode == 0, mlx_out[-3000:]
    assert torch_node.returncode == 0, torch_out[-3000:]
    assert "alice final: model at round" in torch_out
    assert "carol final: model at round" in mlx_out
    assert "carol: joined" in mlx_out
