"""One node training a real transformers language model: ``python lm_worker.py SPEC_JSON``.

Models are built from small configs (nothing is downloaded): GPT-2 (tied
``lm_head``/``wte``) or Llama, optionally wrapped the way users train them —
``DistributedDataParallel`` over a one-rank gloo group, ``torch.compile``
(eager backend: no C++ toolchain needed) — held in bf16, or with a peft LoRA
adapter on a frozen base. The data is a deterministic affine token sequence a
tiny model learns in a few hundred steps. Nodes wait for each other (``started``
files) before training, so they share rounds. The result (losses, commit, bytes
written, the final parameters' digest) goes to ``result.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.events import Event

VOCAB, SEQ, BATCH = 64, 16, 8


def build(family: str, seed: int, lora: bool = False, base_seed: int = 0) -> Any:
    """A tiny model of ``family``; with ``lora``, a seeded LoRA adapter on base ``base_seed``."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(base_seed if lora else seed)
    model: Any
    if family == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(
                n_layer=2,
                n_embd=32,
                n_head=2,
                vocab_size=VOCAB,
                n_positions=SEQ,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
        targets = ["c_attn", "c_fc"]
    else:
        model = LlamaForCausalLM(
            LlamaConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=2,
                num_key_value_heads=2,
                vocab_size=VOCAB,
                max_position_embeddings=SEQ,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
        targets = ["q_proj", "v_proj", "up_proj"]
    if lora:
        from peft import LoraConfig, get_peft_model

        pretrain(model, np.random.default_rng(base_seed))
        torch.manual_seed(seed)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    return model


def pretrain(model: Any, rng: np.random.Generator, steps: int = 40) -> None:
    """A base model worth fine-tuning: trained on another map (``x -> 3x + 1``)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss_of(model, batch(rng, a=3, b=1)).backward()
        opt.step()
        opt.zero_grad()


def batch(rng: np.random.Generator, a: int = 5, b: int = 3) -> torch.Tensor:
    """Sequences of ``x -> ax + b (mod VOCAB)`` from random starts: a bigram table to learn."""
    tokens = np.empty((BATCH, SEQ), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, VOCAB, size=BATCH)
    for t in range(1, SEQ):
        tokens[:, t] = (a * tokens[:, t - 1] + b) % VOCAB
    return torch.from_numpy(tokens)


def loss_of(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def digest(model: Any) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def wrap(model: Any, how: str, out: Path) -> Any:
    if how == "compile":
        return torch.compile(model, backend="eager")
    if how == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"file://{out / 'pg'}", rank=0, world_size=1)
        return DistributedDataParallel(model)
    return model


def main(spec: dict[str, Any]) -> None:
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model = build(spec["family"], spec["seed"], spec.get("lora", False), spec.get("base_seed", 0))
    if spec.get("dtype", "float32") == "bfloat16":
        model = model.to(torch.bfloat16)
    trained = wrap(model, spec.get("wrap", "plain"), out)
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-2)
    log = (out / "events.jsonl").open("a", buffering=1)

    def record(event: Event) -> None:
        fields = {k: str(v) for k, v in attrs.asdict(event).items()}
        log.write(json.dumps({"event": event.kind, **fields}) + "\n")

    rng = np.random.default_rng(spec["seed"])
    losses: list[float] = []
    session = Session(
        trained,
        algorithm=DiLoCo(**spec["algorithm"]),
        mailbox=spec["url"],
        node=spec["node"],
        options=SessionOptions(**spec["options"]),
        callbacks=[record],
    )
    with session:
        (out / "started").write_text("started")
        for other in spec.get("wait_for", []):
            while not Path(other).exists():
                time.sleep(0.05)
        for step in range(spec["steps"]):
            if step == spec.get("pause_at"):
                pause(session, spec)
            loss = loss_of(trained, batch(rng))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
            session.step(samples=BATCH)
    stats = session.stats
    result = {
        "first": float(np.mean(losses[:10])),
        "last": float(np.mean(losses[-10:])),
        "round": session.checkpoint.round if session.checkpoint else None,
        "bytes_out": stats.bytes_out,
        "digest": digest(model),
    }
    (out / "result.json").write_text(json.dumps(result))


def pause(session: Session, spec: dict[str, Any]) -> None:
    """Non-training work of ``pause_s`` (an eval pass, a checkpoint), declared or not."""
    if spec.get("declare_pause", True):
        with session.pause():
            time.sleep(spec["pause_s"])
    else:
        time.sleep(spec["pause_s"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
