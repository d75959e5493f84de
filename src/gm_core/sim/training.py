"""Learners that really train: a small numpy regression per learner, on its own shard.

Theory of operation
-------------------
The cluster harness treats payloads as abstract bytes (a name, a round, a step)
whose digest is all the protocol sees. This module gives those digests tensors:
it keeps a side table ``digest -> fragment array`` and, when the world carries out
a payload command, computes the real numbers under the very digest the cluster is
about to write. A capture stores ``anchor − θ`` of the fragment; a merge runs the
numpy reference (:func:`gm_core.numerics.merge_step`, weights ``tokens²/steps``,
Nesterov outer step) on the deltas the record will name; an alignment folds the
committed fragment into the learner (overwrite, blend or carry,
:func:`gm_core.numerics.align`). So the loss of each committed model is the loss
of exactly what the protocol committed, including its stale or missing deltas.

The task is regression onto a random teacher network with label noise. Each
learner samples minibatches from its own shard; ``skew`` moves the shards' input
means apart so learners' deltas disagree, as on non-i.i.d. data. The inner
optimizer is Adam (state kept across alignments, as DiLoCo does). Every draw
comes from generators spawned from the run's seed.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from numpy.typing import NDArray

from gm_core import cluster, plan
from gm_core.commands import Align, Merge
from gm_core.numerics import Contributions, Layout, align, mean_pairwise_cosine, merge_step
from gm_core.records import AlgorithmConfig, Alignment, TensorSpec
from gm_core.sim.scenario import ModelKind, TrainingSpec

F32 = NDArray[np.float32]
ADAM = (0.9, 0.999, 1e-8)


def schema_of(spec: TrainingSpec) -> tuple[TensorSpec, ...]:
    """The tensors of the model: one dense layer (linear) or two (MLP)."""
    if spec.model is ModelKind.LINEAR:
        return (
            TensorSpec(name="out.weight", shape=(1, spec.inputs), dtype="F32"),
            TensorSpec(name="out.bias", shape=(1,), dtype="F32"),
        )
    return (
        TensorSpec(name="hidden.weight", shape=(spec.hidden, spec.inputs), dtype="F32"),
        TensorSpec(name="hidden.bias", shape=(spec.hidden,), dtype="F32"),
        TensorSpec(name="out.weight", shape=(1, spec.hidden), dtype="F32"),
        TensorSpec(name="out.bias", shape=(1,), dtype="F32"),
    )


@attrs.frozen(kw_only=True, eq=False)
class Shapes:
    """Where each tensor sits in the flat parameter vector, and each fragment's indices."""

    offsets: dict[str, tuple[int, tuple[int, ...]]]
    total: int
    fragments: tuple[NDArray[np.intp], ...]
    layouts: tuple[Layout, ...]


def shapes_of(schema: tuple[TensorSpec, ...], config: AlgorithmConfig) -> Shapes:
    offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
    position = 0
    for t in schema:
        offsets[t.name] = (position, t.shape)
        position += math.prod(t.shape)
    fragment_plan = plan.make_plan(schema, config)
    specs = {t.name: t for t in schema}
    indices, layouts = [], []
    for names in fragment_plan.fragments:
        parts = [np.arange(offsets[n][0], offsets[n][0] + math.prod(offsets[n][1])) for n in names]
        indices.append(np.concatenate(parts).astype(np.intp))
        layouts.append(Layout.from_specs(specs[n] for n in names))
    return Shapes(offsets=offsets, total=position, fragments=tuple(indices), layouts=tuple(layouts))


def _tensor(params: F32, shapes: Shapes, name: str) -> F32:
    start, shape = shapes.offsets[name]
    return params[start : start + math.prod(shape)].reshape(shape)


def loss_and_grad(
    params: F32, shapes: Shapes, x: F32, y: F32, *, grad: bool = True
) -> tuple[float, F32]:
    """Half mean squared error of the model and its gradient (flat, like ``params``)."""
    g = np.zeros_like(params)
    w_out, b_out = _tensor(params, shapes, "out.weight"), _tensor(params, shapes, "out.bias")
    hidden = "hidden.weight" in shapes.offsets
    h = x
    if hidden:
        w_h, b_h = _tensor(params, shapes, "hidden.weight"), _tensor(params, shapes, "hidden.bias")
        h = np.tanh(x @ w_h.T + b_h)
    err = (h @ w_out.T + b_out)[:, 0] - y
    loss = 0.5 * float(np.mean(err * err))
    if not grad:
        return loss, g
    d_out = (err / len(y))[:, None]
    _tensor(g, shapes, "out.weight")[:] = d_out.T @ h
    _tensor(g, shapes, "out.bias")[:] = d_out.sum(axis=0)
    if hidden:
        d_h = (d_out @ w_out) * (1.0 - h * h)
        _tensor(g, shapes, "hidden.weight")[:] = d_h.T @ x
        _tensor(g, shapes, "hidden.bias")[:] = d_h.sum(axis=0)
    return loss, g


@attrs.frozen(kw_only=True, eq=False)
class Problem:
    """The teacher, the learners' shards and the held-out test set."""

    spec: TrainingSpec
    shapes: Shapes
    init: F32
    shards: tuple[tuple[F32, F32], ...]
    test: tuple[F32, F32]


def make_problem(
    spec: TrainingSpec, config: AlgorithmConfig, learners: int, rng: np.random.Generator
) -> Problem:
    schema = schema_of(spec)
    shapes = shapes_of(schema, config)
    teacher = _init(shapes, rng, scale=2.0)
    centers = rng.standard_normal((learners, spec.inputs)) * spec.skew

    def sample(center: NDArray[np.float64], n: int) -> tuple[F32, F32]:
        x = (rng.standard_normal((n, spec.inputs)) + center).astype(np.float32)
        y, _ = _predict(teacher, shapes, x), None
        return x, (y + spec.noise * rng.standard_normal(n)).astype(np.float32)

    shards = tuple(sample(centers[i], spec.shard_size) for i in range(learners))
    mix = centers[rng.integers(0, learners, spec.test_size)]
    test = sample(mix, spec.test_size)
    return Problem(spec=spec, shapes=shapes, init=_init(shapes, rng), shards=shards, test=test)


def _init(shapes: Shapes, rng: np.random.Generator, scale: float = 1.0) -> F32:
    params = np.zeros(shapes.total, dtype=np.float32)
    for name, (start, shape) in shapes.offsets.items():
        if name.endswith("weight"):
            fan_in = shape[-1]
            size = math.prod(shape)
            params[start : start + size] = rng.standard_normal(size) * scale / math.sqrt(fan_in)
    return params


def _predict(params: F32, shapes: Shapes, x: F32) -> F32:
    h = x
    if "hidden.weight" in shapes.offsets:
        w_h, b_h = _tensor(params, shapes, "hidden.weight"), _tensor(params, shapes, "hidden.bias")
        h = np.tanh(x @ w_h.T + b_h)
    out: F32 = (h @ _tensor(params, shapes, "out.weight").T + _tensor(params, shapes, "out.bias"))[
        :, 0
    ]
    return out


@attrs.define(kw_only=True)
class LearnerModel:
    """One learner's parameters, the anchors it aligned with, and its Adam state."""

    theta: F32
    anchors: list[F32]
    m: F32
    v: F32
    t: int = 0
    snaps: dict[int, F32] = attrs.field(factory=dict)
    pending: dict[int, F32] = attrs.field(factory=dict)
    last_loss: float = math.nan


class Trainer:
    """The side table of tensors behind the cluster's abstract payloads, and the learners."""

    def __init__(
        self,
        spec: TrainingSpec,
        config: AlgorithmConfig,
        names: tuple[str, ...],
        rng: np.random.Generator,
    ) -> None:
        self.config = config
        self.problem = make_problem(spec, config, len(names), rng)
        self.shard_of = {name: i for i, name in enumerate(names)}
        self.rngs = dict(zip(names, rng.spawn(len(names)), strict=True))
        self.tensors: dict[str, F32] = {}
        self.models: dict[str, LearnerModel] = {}
        for fragment, idx in enumerate(self.problem.shapes.fragments):
            digest = cluster.digest_of(cluster.payload_bytes("init", fragment))
            self.tensors[digest] = self.problem.init[idx].copy()

    def start(self, name: str) -> None:
        """A (re)started learner holds the initial model until its load aligns the frontier."""
        theta = self.problem.init.copy()
        anchors = [theta[idx].copy() for idx in self.problem.shapes.fragments]
        zeros = np.zeros_like(theta)
        self.models[name] = LearnerModel(theta=theta, anchors=anchors, m=zeros, v=zeros.copy())

    def train(self, name: str, steps: int) -> None:
        """``steps`` Adam steps on minibatches of the learner's own shard."""
        model, rng = self.models[name], self.rngs[name]
        x_all, y_all = self.problem.shards[self.shard_of[name]]
        b1, b2, eps = ADAM
        lr = self.problem.spec.lr
        for _ in range(steps):
            pick = rng.integers(0, len(y_all), self.problem.spec.batch)
            loss, g = loss_and_grad(model.theta, self.problem.shapes, x_all[pick], y_all[pick])
            model.t += 1
            model.m = b1 * model.m + (1 - b1) * g
            model.v = b2 * model.v + (1 - b2) * g * g
            m_hat = model.m / (1 - b1**model.t)
            v_hat = model.v / (1 - b2**model.t)
            model.theta = (model.theta - lr * m_hat / (np.sqrt(v_hat) + eps)).astype(np.float32)
            model.last_loss = loss

    def snap(self, name: str, round_: int, fragment: int) -> None:
        """Copy ``anchor − θ`` of the fragment now, when the capture is issued."""
        model = self.models[name]
        idx = self.problem.shapes.fragments[fragment]
        model.pending[round_] = (model.anchors[fragment] - model.theta[idx]).astype(np.float32)
        model.snaps[round_] = model.theta[idx].copy()

    def register(self, name: str, round_: int, digest: str, poison: bool) -> None:
        """File the copied delta under the digest the cluster's Capture writes."""
        delta = self.models[name].pending.pop(round_)
        if poison:
            delta[0] = np.nan
        self.tensors[digest] = delta

    def merge(self, cmd: Merge) -> float | None:
        """Run the reference merge and outer step; register theta and momentum as written.

        Returns the deltas' mean pairwise cosine, which the closer's merge reports."""
        cfg = self.config
        names = tuple(c.learner for c in cmd.contributions)
        finals = tuple(c.final for c in cmd.contributions)
        contributions = Contributions(
            learners=names,
            weights=tuple(c.weight for c in cmd.contributions),
            final=finals if any(finals) else (),
        )
        theta = self.tensors[cmd.base.theta.digest].copy()
        base_m = cmd.base.momentum
        momentum = self.tensors[base_m.digest].copy() if base_m else np.zeros_like(theta)
        deltas = [self.tensors[c.payload.digest] for c in cmd.contributions]
        cosine = mean_pairwise_cosine(deltas)
        layout = self.problem.shapes.layouts[cmd.fragment]
        merge_step(
            deltas,
            contributions,
            layout,
            cfg.merge,
            cfg.embedding_pattern,
            theta,
            momentum,
            cfg.outer_lr,
            cfg.outer_momentum,
        )
        joined = ",".join(names)
        version = cmd.base.version + 1
        self.tensors[
            cluster.digest_of(cluster.payload_bytes("theta", cmd.round, version, joined))
        ] = theta
        if not cmd.final_only:
            key = cluster.digest_of(cluster.payload_bytes("momentum", cmd.round, joined))
            self.tensors[key] = momentum
        return cosine

    def align(self, name: str, cmd: Align) -> None:
        """Fold the committed fragment into the learner's parameters and move its anchor."""
        model = self.models[name]
        idx = self.problem.shapes.fragments[cmd.fragment]
        committed = self.tensors[cmd.theta.digest]
        part = model.theta[idx].copy()
        snapshot = model.snaps.pop(cmd.round, model.anchors[cmd.fragment])
        mode = cmd.mode
        align(part, committed, mode, cmd.mixing, snapshot if mode is Alignment.CARRY else None)
        model.theta[idx] = part
        model.anchors[cmd.fragment] = committed.copy()
        model.snaps = {r: s for r, s in model.snaps.items() if r > cmd.round}

    def committed_loss(self, thetas: tuple[str, ...]) -> float:
        """Test loss of the model whose fragments are the payloads with these digests."""
        params = np.empty(self.problem.shapes.total, dtype=np.float32)
        for idx, digest in zip(self.problem.shapes.fragments, thetas, strict=True):
            params[idx] = self.tensors[digest]
        x, y = self.problem.test
        loss, _ = loss_and_grad(params, self.problem.shapes, x, y, grad=False)
        return loss
