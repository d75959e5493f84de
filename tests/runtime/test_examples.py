"""The examples run as documented: torch, MLX and JAX nodes share one run and finish."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(script: str, url: str, node: str, steps: int, *more: str) -> subprocess.Popen[str]:
    argv = [sys.executable, str(EXAMPLES / script), "--mailbox", url, "--node", node]
    argv += ["--steps", str(steps), "--sync-every", "40", *more]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize(
    "steps",
    [
        300,  # the default suite: half the example's length (200: 11 rounds, mse x7 at load 12)
        pytest.param(600, marks=pytest.mark.slow),  # the example's own length
    ],
)
def test_the_three_framework_example_runs_torch_mlx_and_jax_learners_to_one_model(
    tmp_path: Path, steps: int
) -> None:
    """examples/three_frameworks.py starts the torch, MLX and JAX example learners on one run:
    each takes part in its rounds and its loss goes down; the committed model, loaded into a
    fresh model of each framework, is the same round, predicts the same and far better."""
    url = f"file://{tmp_path / 'bucket'}"
    argv = [sys.executable, str(EXAMPLES / "three_frameworks.py"), "--mailbox", url, "--json"]
    argv += ["--steps", str(steps)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=steps + 240, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    frameworks = ("torch", "mlx", "jax")
    assert figures["round"] > 0
    assert figures["rounds"] == dict.fromkeys(frameworks, figures["round"]), figures
    mse = [figures[f"committed_mse_{f}"] for f in frameworks]
    assert max(mse) - min(mse) <= 1e-4 * max(mse), figures
    # Far better than untrained; by how much varies with the machine's load (300 steps, four
    # runs at load 3-14: 9.5x to 21x; 2bb8a8f's CI run fell under the 10x asserted before).
    assert all(figures[f"untrained_mse_{f}"] > 5 * mse[0] for f in frameworks), figures
    nodes = {"torch-0", "mlx-1", "jax-2"}
    assert figures["losses"].keys() == nodes
    for node, losses in figures["losses"].items():  # the first step's and the last step's
        assert len(losses) >= 2, (node, losses)
        assert losses[-1] < 0.25 * losses[0], (node, losses)
    bucket = tmp_path / "bucket"
    manifest = json.loads((bucket / "manifest.json").read_text())
    assert [t["name"] for t in manifest["schema"]] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    records = [json.loads(p.read_text()) for p in sorted((bucket / "rounds").glob("*.json"))]
    assert {p["learner"] for r in records for p in r["participants"]} == nodes


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


def test_torchrun_ddp_and_fsdp2_example_groups_train_one_run(tmp_path: Path) -> None:
    """examples/torchrun_learner.py under torchrun (2 ranks, gloo): a DDP group and an FSDP2
    group are two learners of one run; both ranks of each end at the same commit."""
    url = f"file://{tmp_path / 'bucket'}"
    groups = {}
    for parallel in ("ddp", "fsdp2"):
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        argv += ["--nproc-per-node", "2", str(EXAMPLES / "torchrun_learner.py")]
        argv += ["--mailbox", url, "--node-id", parallel, "--parallel", parallel]
        argv += ["--steps", "120", "--sync-every", "40"]
        groups[parallel] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for group in groups.values():
        output = group.communicate(timeout=300)[0]
        assert group.returncode == 0, f"exit {group.returncode}: {output[-3000:]}"
        # Two ranks print to one pipe: their lines may run together, so match, not split.
        finals = sorted(re.findall(r"rank (\d+) final: model at round (-?\d+)", output))
        assert [rank for rank, _ in finals] == ["0", "1"], output[-3000:]
        rounds = {int(round_) for _, round_ in finals}
        assert len(rounds) == 1, finals  # the ranks of a group end at one commit
        assert rounds.pop() > 0, finals
    manifest = json.loads((tmp_path / "bucket" / "manifest.json").read_text())
    assert manifest["created_by"] in ("ddp", "fsdp2")
