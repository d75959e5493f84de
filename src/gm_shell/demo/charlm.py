"""A small character-level transformer: the model every demo learner and the baseline train.

Theory of operation
-------------------
A pre-norm GPT (token and position embeddings, ``depth`` blocks of causal
self-attention and a GELU MLP, a final norm and an untied head), sized so that
four learner processes sharing two CPU cores each make several steps per second.
Parameter names matter to gm: blocks live under ``blocks.<i>.`` so a strided
partition deals them to fragments, and the embeddings are named ``*embed*`` so
the merge averages them plainly (the default ``embedding_pattern``). The head is
untied so every tensor has exactly one name (a fragment holds whole tensors).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor, nn


@attrs.frozen(kw_only=True)
class ModelConfig:
    vocab: int
    context: int = 64
    width: int = 64
    depth: int = 3
    heads: int = 4

    def __attrs_post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")


class Attention(nn.Module):
    """Causal multi-head self-attention through torch's fused kernel."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

    def forward(self, x: Tensor) -> Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, time, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.proj(y.transpose(1, 2).reshape(batch, time, width))
        return out


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width),
            nn.GELU(),
            nn.Linear(4 * config.width, config.width),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        out: Tensor = x + self.mlp(self.norm2(x))
        return out


class CharLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embed = nn.Embedding(config.vocab, config.width)
        self.pos_embed = nn.Parameter(torch.zeros(config.context, config.width))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)
        self.apply(_init)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, ids: Tensor) -> Tensor:
        """Logits of shape (batch, time, vocab) for ids of shape (batch, time)."""
        x = self.token_embed(ids) + self.pos_embed[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.head(self.norm(x))
        return logits


def _init(module: nn.Module) -> None:
    """GPT-2's small normal init: a tiny model trains faster from it than from torch's."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build(config: ModelConfig, seed: int) -> CharLM:
    """The model with seeded initial parameters (the same on every process)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return CharLM(config)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def loss_of(model: CharLM, windows: Tensor) -> Tensor:
    """Mean next-character cross-entropy (nats) over windows of shape (batch, context + 1)."""
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model: CharLM, windows: Tensor, chunk: int = 64) -> float:
    """Mean loss over fixed held-out windows, in chunks to bound memory; restores train mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    for start in range(0, windows.shape[0], chunk):
        part = windows[start : start + chunk]
        total += float(loss_of(model, part)) * part.shape[0]
    model.train(was_training)
    return total / windows.shape[0]
