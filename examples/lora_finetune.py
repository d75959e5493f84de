"""One node of a gm run that fine-tunes a causal language model with a peft LoRA adapter.

    python examples/lora_finetune.py --mailbox file:///tmp/gm-lora --node alice
    python examples/lora_finetune.py --mailbox file:///tmp/gm-lora --node bob

Only the adapter is synchronized: gm syncs the trainable parameters (``requires_grad``),
so the frozen base never travels; the manifest pins it by digest, and a node with
another base is refused by name. Every node must start from the same base: by default
a small GPT-2 built from a config and pre-trained here for a few seconds with a fixed
seed (nothing is downloaded); ``--base NAME_OR_PATH`` loads a real one with
``AutoModelForCausalLM.from_pretrained`` instead (a Hub name downloads it).

The data is synthetic on purpose (``x -> 5x + 3 mod V`` token sequences, while the
default base learned ``x -> 3x + 1``), so the loss printed falls on every node. At the
end each node prints its adapter's bytes and what it uploaded, and with ``--save DIR``
writes the committed adapter with ``save_pretrained``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np
import torch

from gm_shell import DiLoCo, Session, SessionOptions

VOCAB, SEQ, BATCH = 64, 16, 8


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mailbox", default="file:///tmp/gm-lora", help="the run's URL")
    parser.add_argument("--node", default=None, help="this node's id (default: host-pid)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--fragments", type=int, default=2)
    parser.add_argument("--rank", type=int, default=4, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=2e-2)
    parser.add_argument("--base", default=None, help="a transformers model name or path")
    parser.add_argument("--save", default=None, help="save the committed adapter here")
    parser.add_argument("--seed", type=int, default=None)
    return parser.parse_args()


def tokens(rng: np.random.Generator, vocab: int, a: int = 5, b: int = 3) -> torch.Tensor:
    out = np.empty((BATCH, SEQ), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, size=BATCH)
    for t in range(1, SEQ):
        out[:, t] = (a * out[:, t - 1] + b) % vocab
    return torch.from_numpy(out)


def base_model(name: str | None) -> tuple[Any, int, list[str]]:
    """The frozen base, its vocabulary size, and the modules the adapter targets."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    if name is not None:
        model = AutoModelForCausalLM.from_pretrained(name)
        return model, min(model.config.vocab_size, VOCAB), ["c_attn", "q_proj", "v_proj"]
    torch.manual_seed(0)  # the same base on every node
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(40):  # a base worth fine-tuning: it knows another map
        batch = tokens(rng, VOCAB, a=3, b=1)
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, VOCAB, ["c_attn", "c_fc"]


def main() -> None:
    args = arguments()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from peft import LoraConfig, get_peft_model

    base, vocab, targets = base_model(args.base)
    model = get_peft_model(
        base, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=targets)
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    adapter_bytes = 4 * sum(p.numel() for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=args.lr)
    rng = np.random.default_rng(args.seed)
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments)
    options = SessionOptions(poll_s=0.1)
    with Session(
        model, algorithm=algorithm, mailbox=args.mailbox, node=args.node, options=options
    ) as s:
        for step in range(args.steps):
            batch = tokens(rng, vocab)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step(samples=BATCH)
            if step % 50 == 0:
                print(f"{s.node} step {step}: loss {loss.item():.3f} (round {s.round})", flush=True)
    assert s.checkpoint is not None
    print(f"{s.node} final: model at round {s.checkpoint.round}, loss {loss.item():.3f}")
    print(
        f"{s.node} adapter {adapter_bytes:,} bytes ({len(trainable)} tensors, the base is frozen); "
        f"uploaded {s.stats.bytes_out:,} bytes in {s.stats.put_requests} PUTs"
    )
    if args.save:
        model.save_pretrained(args.save)  # the committed adapter: close left it in the model
        print(f"{s.node} saved the adapter to {args.save}")


if __name__ == "__main__":
    main()
