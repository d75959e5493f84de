"""The examples run as documented: a torch node and an MLX node share one run and finish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(script: str, url: str, node: str, steps: int, *more: str) -> subprocess.Popen[str]:
    argv = [sys.executable, str(EXAMPLES / script), "--mailbox", url, "--node", node]
    argv += ["--steps", str(steps), "--sync-every", "40", *more]
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


def test_a_torch_example_node_started_again_with_resume_goes_on_from_its_step(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    outputs = []
    for steps in (20, 30):
        node = start("torch_learner.py", url, "alice", steps, "--resume")
        outputs.append(node.communicate(timeout=240)[0])
        assert node.returncode == 0, outputs[-1][-3000:]
    assert "alice starts at step 0" in outputs[0]
    assert "alice starts at step 20" in outputs[1]
    assert "alice: resumed at step 20" in outputs[1]
    assert "alice final: model at round" in outputs[1]


@pytest.mark.slow  # two transformers+peft processes: minutes of CPU on 2 cores
def test_two_lora_finetune_nodes_share_a_run_and_ship_the_adapter_alone(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    argv = [sys.executable, str(EXAMPLES / "lora_finetune.py"), "--mailbox", url, "--steps", "80"]
    nodes = {
        name: subprocess.Popen(
            [*argv, "--node", name, "--seed", str(seed), "--save", str(tmp_path / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed, name in enumerate(("alice", "bob"))
    }
    outputs = {name: node.communicate(timeout=300)[0] for name, node in nodes.items()}
    for name, node in nodes.items():
        out = outputs[name]
        assert node.returncode == 0, out[-3000:]
        assert f"{name} final: model at round" in out
        assert "the base is frozen" in out
        assert (tmp_path / name / "adapter_config.json").exists()
    manifest = json.loads((tmp_path / "bucket" / "manifest.json").read_text())
    assert all(".lora_" in t["name"] for t in manifest["schema"])
    assert len(manifest["frozen"]) > len(manifest["schema"])
