"""The JAX adapter: pytree paths as dotted names, fp32 gathers and scatters, nnx and linen.

The documented spelling of a name (segments joined with ``.``: a dict key as itself, a
list index in decimal) is stated here once more, independently of the adapter, by
:func:`spelled`; the properties check the adapter against it on generated trees.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx
from hypothesis import given
from hypothesis import strategies as st
from runtime_worker import jax_model, torch_model

from gm_shell import DiLoCo, JaxParams, Session, SessionOptions, align
from gm_shell.jax_model import name_of
from gm_shell.models import ModelError, adapt

DTYPES = {"F32": jnp.float32, "BF16": jnp.bfloat16, "F16": jnp.float16}

keys = st.text(alphabet="abcXYZ_019", min_size=1, max_size=3)
shapes = st.lists(st.integers(1, 3), max_size=2).map(tuple)
leaves = st.tuples(shapes, st.sampled_from(sorted(DTYPES)))
trees = st.recursive(
    leaves,
    lambda inner: (
        st.dictionaries(keys, inner, min_size=1, max_size=3)
        | st.lists(inner, min_size=1, max_size=3)
    ),
    max_leaves=8,
).filter(lambda spec: not isinstance(spec, tuple))  # a container at the root: names


def build(spec: Any, rng: np.random.Generator) -> Any:
    """The pytree a generated spec describes, with random values."""
    if isinstance(spec, dict):
        return {k: build(v, rng) for k, v in spec.items()}
    if isinstance(spec, list):
        return [build(v, rng) for v in spec]
    shape, dtype = spec
    return jnp.asarray(rng.normal(size=shape), dtype=DTYPES[dtype])


def spelled(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(name, leaf) as the docstring spells names, in jax's flatten order (keys sorted)."""
    if isinstance(tree, dict):
        items: list[tuple[Any, Any]] = sorted(tree.items())
    elif isinstance(tree, list):
        items = list(enumerate(tree))
    else:
        return [(prefix.removesuffix("."), tree)]
    return [pair for key, sub in items for pair in spelled(sub, f"{prefix}{key}.")]


def walk(tree: Any, name: str) -> Any:
    """The leaf a name leads to, read back from its segments."""
    for segment in name.split("."):
        tree = tree[int(segment)] if isinstance(tree, list) else tree[segment]
    return tree


@given(spec=trees, seed=st.integers(0, 2**16))
def test_pytree_names_are_the_dotted_paths_in_flatten_order(spec: Any, seed: int) -> None:
    tree = build(spec, np.random.default_rng(seed))
    adapter = adapt(JaxParams(tree), ".")
    expected = spelled(tree)
    assert [t.name for t in adapter.schema()] == [name for name, _ in expected]
    assert [t.name for t in adapter.schema()] == [
        name_of(tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path))
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]
    for spec_, (name, leaf) in zip(adapter.held(), expected, strict=True):
        assert walk(tree, name) is leaf
        assert spec_.shape == leaf.shape
        assert DTYPES[spec_.dtype] == leaf.dtype


@given(spec=trees, seed=st.integers(0, 2**16), data=st.data())
def test_scatter_then_gather_gives_what_the_parameters_hold(
    spec: Any, seed: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(seed)
    params = JaxParams(build(spec, rng))
    names = [name for name, _ in spelled(params.tree)]
    chosen = data.draw(st.permutations(names).flatmap(lambda p: st.just(p[: len(p) // 2 + 1])))
    untouched = {n: np.asarray(walk(params.tree, n)) for n in names if n not in chosen}
    access = adapt(params, ".").fragment(chosen)
    x = rng.normal(size=access.layout.total).astype(np.float32)
    access.scatter(x)
    back = np.empty_like(x)
    access.gather(back)
    np.testing.assert_array_equal(back, access.held(x))
    for span in access.layout.spans:
        leaf = walk(params.tree, span.name)
        rounded = x[span.start : span.stop].astype(leaf.dtype).astype(np.float32)
        np.testing.assert_array_equal(back[span.start : span.stop], rounded)
        if leaf.dtype == jnp.float32:
            np.testing.assert_array_equal(rounded, x[span.start : span.stop])
    for name, before in untouched.items():
        np.testing.assert_array_equal(np.asarray(walk(params.tree, name)), before)


@pytest.mark.parametrize(
    "tree",
    [{"a.b": jnp.zeros(1)}, {"": jnp.zeros(1)}, {(1, 2): jnp.zeros(1)}, jnp.zeros(1)],
    ids=["dot", "empty", "tuple-key", "root"],
)
def test_keys_that_cannot_be_spelled_are_refused_by_name(tree: Any) -> None:
    with pytest.raises(ModelError, match=r"segment|root"):
        adapt(JaxParams(tree))


class Pair:
    """A pytree node whose two children's keys (index 0, dict key "0") spell one segment."""

    def __init__(self, first: Any, second: Any) -> None:
        self.children = (first, second)


jax.tree_util.register_pytree_with_keys(
    Pair,
    lambda p: (
        (
            (jax.tree_util.SequenceKey(0), p.children[0]),
            (jax.tree_util.DictKey("0"), p.children[1]),
        ),
        None,
    ),
    lambda _, children: Pair(*children),
)


def test_two_paths_that_spell_one_name_are_refused() -> None:
    adapt(JaxParams({"a": [jnp.zeros(1)], "b": {"0": jnp.zeros(1)}}))  # a.0 and b.0: two names
    with pytest.raises(ModelError, match=r"paths \(0,\) and \('0',\) both spell the name '0'"):
        adapt(JaxParams(Pair(jnp.zeros(1), jnp.zeros(1))))


def test_an_nnx_twin_of_the_torch_model_has_its_schema_and_trains_after_a_scatter() -> None:
    model, train = jax_model(0)
    adapter = adapt(model)
    assert adapter.schema() == adapt(torch_model(0)[0]).schema()
    access = adapter.fragment(["fc2.bias", "fc1.weight"])
    x = np.linspace(-1, 1, access.layout.total, dtype=np.float32)
    access.scatter(x)
    np.testing.assert_array_equal(np.asarray(model.fc2.bias[...]), x[:1])
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(4, 8)).astype(np.float32)
    train(inputs, inputs[:, :1])  # the nnx.Optimizer made before the scatter trains on
    back = np.empty_like(x)
    access.gather(back)
    assert 0 < np.abs(back - x).max() < 1.0


def test_nnx_parameters_in_definition_order_and_only_params() -> None:
    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.scale = nnx.Param(jnp.ones(2))
            self.count = nnx.BatchStat(jnp.zeros(()))
            self.shift = nnx.Param(jnp.zeros(2, jnp.bfloat16))

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.zeta = Block(rngs)
            self.layers = nnx.List([Block(rngs) for _ in range(11)])
            self.heads = nnx.Dict({"z": Block(rngs), "a": Block(rngs)})

    adapter = adapt(Net(nnx.Rngs(0)))
    blocks = ["zeta", *(f"layers.{i}" for i in range(11)), "heads.z", "heads.a"]
    assert [t.name for t in adapter.schema()] == [
        f"{b}.{p}" for b in blocks for p in ("scale", "shift")
    ]
    assert {t.dtype for t in adapter.held()} == {"F32", "BF16"}
    assert adapt(Net(nnx.Rngs(0)), r"\.shift$").schema() == tuple(
        t for t in adapter.schema() if t.name.endswith(".shift")
    )


def test_linen_params_go_in_a_holder_and_the_module_is_refused_by_name() -> None:
    module = linen.Sequential([linen.Dense(3), linen.Dense(1)])
    variables = module.init(jax.random.key(0), jnp.ones((1, 2)))
    with pytest.raises(ModelError, match=r"JaxParams\(variables\['params'\]\)"):
        adapt(module)
    with pytest.raises(ModelError, match="wrap it in JaxParams"):
        adapt(variables["params"])
    params = JaxParams(variables["params"])
    assert [t.name for t in adapt(params).schema()] == [
        "layers_0.bias",
        "layers_0.kernel",
        "layers_1.bias",
        "layers_1.kernel",
    ]
    tx = optax.adam(1e-2)
    opt_state = tx.init(params.tree)
    grads = jax.tree_util.tree_map(jnp.ones_like, params.tree)
    updates, opt_state = tx.update(grads, opt_state, params.tree)
    params.tree = optax.apply_updates(params.tree, updates)
    assert adapt(params).schema() == adapt(JaxParams(variables["params"])).schema()
    access = adapt(params).fragment(["layers_0.bias"])
    out = np.empty(3, np.float32)
    access.gather(out)
    np.testing.assert_array_equal(out, np.asarray(params.tree["layers_0"]["bias"]))
    params.tree = {"other": params.tree}
    with pytest.raises(ModelError, match="changed structure"):
        access.gather(out)


def test_integer_leaves_are_frozen_and_pinned() -> None:
    params = JaxParams({"w": jnp.ones(3), "step": jnp.arange(2)})
    adapter = adapt(params)
    assert [t.name for t in adapter.schema()] == ["w"]
    assert [(t.name, t.shape) for t in adapter.frozen()] == [("step", (2,))]
    with pytest.raises(ModelError, match=r"'step' has dtype int"):
        adapt(params, "step")


def test_a_session_hands_the_run_parameters_back_through_the_holder() -> None:
    """An optax loop over ``params.tree``: the session rebinds it, and at close it is the
    run's newest commit (read back into a fresh holder by ``align``)."""
    url = f"memory://jax-{uuid.uuid4().hex[:10]}/run"
    rng = np.random.default_rng(0)
    params = JaxParams({"w": jnp.zeros((4, 1)), "b": jnp.zeros(1)})
    teacher = rng.normal(size=(4, 1)).astype(np.float32)
    tx = optax.sgd(0.1)
    opt_state = tx.init(params.tree)

    def loss(tree: Any, x: Any, y: Any) -> Any:
        return jnp.mean((x @ tree["w"] + tree["b"] - y) ** 2)

    grad = jax.jit(jax.value_and_grad(loss))
    seen: list[Any] = []
    losses: list[float] = []
    options = SessionOptions(poll_s=0.02, renew_s=0.3, close_timeout_s=10.0)
    algorithm = DiLoCo(sync_every=8, fragments=2, quorum=1, outer_lr=0.5)
    with Session(params, algorithm=algorithm, mailbox=url, options=options) as session:
        for _ in range(48):
            x = rng.normal(size=(16, 4)).astype(np.float32)
            value, grads = grad(params.tree, x, x @ teacher)
            updates, opt_state = tx.update(grads, opt_state, params.tree)
            params.tree = optax.apply_updates(params.tree, updates)
            stepped = params.tree
            session.step(samples=16)
            seen.append(params.tree is not stepped)
            losses.append(float(value))
    assert session.round >= 2
    assert any(seen)  # alignments rebound the tree during training
    assert losses[-1] < 0.2 * losses[0]
    fresh = JaxParams({"w": jnp.ones((4, 1)), "b": jnp.ones(1)})
    assert align(fresh, mailbox=url) == session.checkpoint
    for name in ("w", "b"):
        np.testing.assert_array_equal(np.asarray(fresh.tree[name]), np.asarray(params.tree[name]))


def test_jax_is_imported_only_when_a_jax_model_is_adapted() -> None:
    probe = (
        "import sys, mlx.nn, gm_shell\n"
        "from gm_shell.models import adapt\n"
        "adapt(mlx.nn.Linear(2, 2))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'flax', 'optax'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_nnx_lora_run_ships_the_adapters_and_pins_the_base() -> None:
    class Tuned(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.base = nnx.Linear(3, 4, rngs=rngs)
            self.lora = nnx.LoRA(3, 2, 4, rngs=rngs)

    adapter = adapt(Tuned(nnx.Rngs(0)), r"lora_")
    assert [t.name for t in adapter.schema()] == ["lora.lora_a", "lora.lora_b"]
    assert [t.name for t in adapter.frozen()] == ["base.kernel", "base.bias"]
    other = adapt(Tuned(nnx.Rngs(1)), r"lora_").frozen()
    assert [t.digest for t in other] != [t.digest for t in adapter.frozen()]
