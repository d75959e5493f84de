"""The demo's whole configuration, written once to the run folder and read by every process.

Theory of operation
-------------------
The launcher decides everything (data, model, inner optimizer, gm knobs, sizes)
and writes it as ``spec.json`` in the run folder; each learner process and the
baseline process read that one file, so they cannot disagree about what they
train. Values are frozen attrs classes; the JSON codec is cattrs, strict about
unknown fields so a stale spec file fails loudly instead of half-applying.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import cattrs

from gm_shell.demo import corpus
from gm_shell.demo.charlm import ModelConfig
from gm_shell.demo.stream import DataConfig
from gm_shell.demo.training import InnerConfig


@attrs.frozen(kw_only=True)
class GmKnobs:
    """The DiLoCo settings the demo passes to ``Session``; see ``spec/`` for their meaning."""

    sync_every: int = 10
    fragments: int = 2
    outer_lr: float = 0.7
    outer_momentum: float = 0.5
    alignment: str = "carry"
    delta_format: str = "F32"
    quorum: int | None = None
    """Snapshots a round waits for; None: every learner. Learners keep training while a
    round is open (``in_flight``), and a closer never waits for a learner whose lease has
    lapsed, so waiting for all costs little when learners run at the same speed — and
    averages every learner's delta into every round, which data-parallel parity needs."""


@attrs.frozen(kw_only=True)
class DemoSpec:
    name: str = "demo"
    learners: int = 4
    eval_every: int = 25
    """Steps between evaluations of the baseline (the launcher scores gm's commits by time)."""
    model_seed: int = 0
    data: DataConfig = attrs.field(factory=DataConfig)
    model: ModelConfig = attrs.field(factory=lambda: ModelConfig(vocab=len(corpus.VOCAB)))
    inner: InnerConfig = attrs.field(factory=lambda: InnerConfig(steps=800, lr=1e-2))
    gm: GmKnobs = attrs.field(factory=GmKnobs)

    def __attrs_post_init__(self) -> None:
        if self.model.context < self.data.context:
            raise ValueError(
                f"model context {self.model.context} is shorter than the data's {self.data.context}"
            )

    @property
    def steps(self) -> int:
        """Optimizer steps of each learner, and of the baseline."""
        return self.inner.steps

    @property
    def quorum(self) -> int:
        return self.gm.quorum or self.learners

    def tokens_at(self, step: int) -> int:
        """Tokens trained by all workers together after ``step`` steps each."""
        return step * self.learners * self.data.tokens_per_batch


def tiny(name: str = "tiny", learners: int = 2) -> DemoSpec:
    """A spec small enough for a test: a one-block model, a short corpus, a few dozen steps."""
    return DemoSpec(
        name=name,
        learners=learners,
        eval_every=10,
        data=DataConfig(train_chars=20_000, eval_chars=5_000, eval_windows=16, context=32, batch=8),
        model=ModelConfig(vocab=len(corpus.VOCAB), context=32, width=32, depth=1, heads=2),
        inner=InnerConfig(steps=40, lr=1e-2, warmup=5),
        gm=GmKnobs(sync_every=10, fragments=2),
    )


_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


def save(spec: DemoSpec, path: Path) -> None:
    path.write_text(json.dumps(_CONVERTER.unstructure(spec), indent=2) + "\n")


def load(path: Path) -> DemoSpec:
    return _CONVERTER.structure(json.loads(path.read_text()), DemoSpec)
