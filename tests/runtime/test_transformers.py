"""Real transformers models in real runs: nothing downloaded, models built from small configs.

Each node is a process of its own (``lm_worker.py``): wrappers such as
``torch.compile`` and DDP's process group are per process, as in real use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lm_worker import batch, build, loss_of

import gm_shell

HERE = Path(__file__).parent
OPTIONS = {"poll_s": 0.05, "renew_s": 0.5, "stall_timeout_s": 120.0, "join_timeout_s": 120.0}


def algorithm(**over: Any) -> dict[str, Any]:
    return {
        "sync_every": 8,
        "fragments": 2,
        "quorum": 1,
        "in_flight": 2,
        "lease_timeout_s": 5.0,
        "takeover_floor_s": 5.0,
        **over,
    }


def run_nodes(url: str, workdir: Path, nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Start every node (each waits for all to have joined), wait, and return their results."""
    started = [str(workdir / name / "started") for name in nodes]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    procs = {}
    for name, extra in nodes.items():
        spec = {"url": url, "node": name, "out": str(workdir / name), "options": OPTIONS}
        spec |= {"wait_for": started, **extra}
        (workdir / name).mkdir(parents=True)
        log = (workdir / name / "log").open("wb")
        argv = [sys.executable, str(HERE / "lm_worker.py"), json.dumps(spec)]
        procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for name, proc in procs.items():
            code = proc.wait(timeout=400)
            assert code == 0, (workdir / name / "log").read_text(errors="replace")[-4000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return {name: json.loads((workdir / name / "result.json").read_text()) for name in nodes}


def participants(bucket: Path) -> set[str]:
    return {
        p["learner"]
        for path in (bucket / "rounds").glob("*.json")
        for p in json.loads(path.read_text())["participants"]
    }


def test_plain_compiled_and_ddp_gpt2_nodes_train_one_run(tmp_path: Path) -> None:
    """Three GPT-2 nodes, wrapped three ways, share one run; tied weights stay tied."""
    bucket = tmp_path / "bucket"
    url = f"file://{bucket}"
    common = {"family": "gpt2", "steps": 80, "algorithm": algorithm()}
    results = run_nodes(
        url,
        tmp_path,
        {
            "plain": {**common, "seed": 1, "wrap": "plain"},
            "compiled": {**common, "seed": 2, "wrap": "compile"},
            "ddp": {**common, "seed": 3, "wrap": "ddp"},
        },
    )
    assert participants(bucket) == {"plain", "compiled", "ddp"}
    for name, result in results.items():
        assert result["last"] < 0.5 * result["first"], (name, result)
    evaluator = build("gpt2", seed=9)
    tokens = batch(np.random.default_rng(0))
    with torch.no_grad():
        before = float(loss_of(evaluator, tokens))
    checkpoint = gm_shell.align(evaluator, mailbox=url)
    assert checkpoint.round >= 0
    assert evaluator.lm_head.weight is evaluator.transformer.wte.weight  # still tied
    with torch.no_grad():
        after = float(loss_of(evaluator, tokens))
    assert after < 0.5 * before, (before, after)


def test_the_default_embedding_pattern_finds_the_embeddings_of_common_families() -> None:
    from gm_core.numerics.merge import is_embedding
    from gm_core.records import EMBEDDING_PATTERN
    from gm_shell.models import adapt

    found = {
        family: {
            t.name
            for t in adapt(build(family, seed=0)).schema()
            if is_embedding(t.name, EMBEDDING_PATTERN)
        }
        for family in ("gpt2", "llama")
    }
    # GPT-2's lm_head is tied to wte: one parameter, named once.
    assert found["gpt2"] == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert found["llama"] == {"model.embed_tokens.weight", "lm_head.weight"}
