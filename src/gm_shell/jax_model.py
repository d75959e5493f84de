"""JAX models: a flax ``nnx.Module``, or a pytree of JAX arrays in a :class:`JaxParams`.

Theory of operation
-------------------
The adapter gives gm what :mod:`gm_shell.models` gives it for torch and MLX: a
schema of named parameters and, per fragment, a gather into and a scatter from a
flat fp32 host buffer (:class:`gm_shell.models.FragmentAccess`), called on the
training thread between two optimizer steps.

JAX arrays are immutable, so "writing the parameters" means rebinding them
somewhere the training loop reads from:

- An ``nnx.Module`` is already that place: each parameter is an ``nnx.Param``
  variable whose value the scatter replaces (``Variable.set_value``). The module,
  its variables and an ``nnx.Optimizer`` built on it stay the same objects, so an
  nnx + optax loop needs no change at all.
- A pytree (flax ``linen`` params, a dict of arrays) goes into a
  :class:`JaxParams`, a mutable holder. The loop reads ``params.tree`` at each
  step and stores the updated tree back; a scatter stores a new tree there::

      params = JaxParams(variables["params"])
      with Session(params, algorithm=..., mailbox=url) as s:
          for x, y in data:
              grads = jax.grad(loss)(params.tree, x, y)
              updates, opt_state = tx.update(grads, opt_state, params.tree)
              params.tree = optax.apply_updates(params.tree, updates)
              s.step(samples=len(x))     # may put the run's parameters in params.tree

  The optimizer state is the loop's own, as with torch: alignment changes the
  parameters, never ``opt_state``.

Names (the safetensors keys of every payload): the path from the root to the
parameter, its segments joined with ``.``. A dict key is spelled as itself (an
``int`` key in decimal), a list or tuple index (an ``nnx.List`` entry) in
decimal, an attribute (an nnx module's attribute, a dataclass or namedtuple
field) by its name. So ``{"fc1": {"weight": w}}`` and an nnx module with
``self.fc1 = Linear(...)`` holding ``self.weight = nnx.Param(w)`` both name ``w``
``fc1.weight``, as torch and MLX name the same parameter; linen's ``Dense_0``
with ``kernel`` is ``Dense_0.kernel``. A segment that is empty, contains a ``.``
or is not a string or an integer is refused by name, and so are two paths that
spell one name: a name always means one parameter.

Which leaves are parameters: in an nnx module, its ``nnx.Param`` variables (and
subclasses such as ``LoRAParam``); other variables (``BatchStat``, RNG state)
are not synchronized, like torch's buffers. In a pytree, every leaf; the
floating ones are trainable, the others frozen (pinned by digest, never shipped).

Order (the schema's, which must equal the run's): an nnx module's parameters in
definition order (attribute assignment order, list index, dict insertion order),
the order torch's ``named_parameters()`` and MLX's ``parameters()`` give, so an
nnx twin of a torch model has the torch model's schema. A pytree's in
``jax.tree_util``'s flatten order (dict keys sorted), the order ``tree_map`` and
``optax.apply_updates`` keep, so the schema is the same before and after any
number of updates; a pytree twin of a torch model therefore joins its run only
where sorted order is the torch model's order.

Precision and placement: values cross as fp32 (bf16/fp16 parameters converted
both ways, :meth:`held` says what a parameter keeps); a scattered array is put
with the sharding of the array it replaces (its device, or its mesh).

JAX and flax are imported only when a model of theirs is adapted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np

from gm_core.manifest import wire_schema
from gm_core.numerics.arrays import F32
from gm_core.numerics.layout import Layout
from gm_core.records import FrozenTensor, TensorSpec
from gm_shell.models import ModelError, Sync, _frozen_tensor, _layout, _split

_JAX_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}

Path = tuple[str | int, ...]


class JaxParams:
    """A pytree of JAX arrays that a :class:`~gm_shell.Session` may replace: read ``tree``
    at each step, assign the updated tree to it (see the module's docstring)."""

    __slots__ = ("tree",)

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def __repr__(self) -> str:
        return f"JaxParams({self.tree!r})"


def is_jax_model(model: Any) -> bool:
    """Whether ``model`` is JAX's to adapt (no JAX import: a look at its classes)."""
    return isinstance(model, JaxParams) or any(
        cls.__module__.split(".")[0] == "flax" for cls in type(model).__mro__
    )


def name_of(path: Path) -> str:
    """The canonical name of a parameter at ``path`` (segments as str or int)."""
    if not path:
        raise ModelError("a parameter at the root has no name: put the array in a dict")
    parts = []
    for segment in path:
        if isinstance(segment, bool) or not isinstance(segment, str | int):
            raise ModelError(f"path {path!r}: segment {segment!r} is not a string or an integer")
        text = str(segment)
        if not text or "." in text:
            raise ModelError(f"path {path!r}: segment {text!r} cannot be part of a dotted name")
        parts.append(text)
    return ".".join(parts)


def _segment(key: Any) -> Any:
    """A ``jax.tree_util`` path entry as a name segment (checked by :func:`name_of`)."""
    from jax import tree_util

    if isinstance(key, tree_util.DictKey):
        return key.key
    if isinstance(key, tree_util.SequenceKey):
        return key.idx
    if isinstance(key, tree_util.GetAttrKey):
        return key.name
    if isinstance(key, tree_util.FlattenedIndexKey):
        return key.key
    raise ModelError(f"pytree path entry {key!r} has no name")


def _spec(name: str, leaf: Any) -> TensorSpec:
    dtype = _JAX_DTYPES.get(str(getattr(leaf, "dtype", "")))
    if dtype is None:
        raise ModelError(f"parameter {name!r} has dtype {leaf.dtype}; gm trains float parameters")
    return TensorSpec(name=name, shape=tuple(leaf.shape), dtype=dtype)


def _is_float(leaf: Any) -> bool:
    return str(leaf.dtype) in _JAX_DTYPES


class JaxModel:
    """An nnx module's ``nnx.Param`` variables or a :class:`JaxParams` tree's leaves, by name."""

    framework = "jax"

    def __init__(self, model: Any, sync: Sync = None) -> None:
        slots = _TreeSlots(model) if isinstance(model, JaxParams) else _NnxSlots(model)
        self._slots: _Slots = slots
        leaves = self._slots.read(self._slots.names)
        trainable = {n: _is_float(leaf) for n, leaf in zip(self._slots.names, leaves, strict=True)}
        synced, self._frozen = _split(trainable.items(), sync)
        current = dict(zip(self._slots.names, leaves, strict=True))
        self._specs = {n: _spec(n, current[n]) for n in synced}

    def schema(self) -> tuple[TensorSpec, ...]:
        return wire_schema(self.held())

    def held(self) -> tuple[TensorSpec, ...]:
        return tuple(self._specs.values())

    def frozen(self) -> tuple[FrozenTensor, ...]:
        import jax

        leaves = jax.device_get(self._slots.read(self._frozen))
        return tuple(
            _frozen_tensor(n, np.asarray(leaf, dtype=np.float32))
            for n, leaf in zip(self._frozen, leaves, strict=True)
        )

    def fragment(self, names: Sequence[str]) -> _JaxFragment:
        return _JaxFragment(_layout(self._specs, names), self._slots)


class _Slots(Protocol):
    """Where a model's parameters live: read them by name, rebind them by name."""

    names: list[str]

    def read(self, names: Sequence[str]) -> list[Any]: ...

    def write(self, values: Mapping[str, Any]) -> None: ...


def _checked(paths: Sequence[Path]) -> list[str]:
    names = [name_of(p) for p in paths]
    seen: dict[str, Path] = {}
    for name, path in zip(names, paths, strict=True):
        if name in seen:
            raise ModelError(f"paths {seen[name]!r} and {path!r} both spell the name {name!r}")
        seen[name] = path
    return names


class _TreeSlots:
    """The leaves of ``holder.tree``, whose structure must stay the one adapted."""

    def __init__(self, holder: JaxParams) -> None:
        from jax import tree_util

        self._holder = holder
        flat, treedef = tree_util.tree_flatten_with_path(holder.tree)
        self._treedef: Any = treedef
        paths = [tuple(_segment(k) for k in path) for path, _ in flat]
        self.names = _checked(paths)
        self._index = {n: i for i, n in enumerate(self.names)}
        for name, (_, leaf) in zip(self.names, flat, strict=True):
            if not hasattr(leaf, "dtype") or not hasattr(leaf, "shape"):
                raise ModelError(f"leaf {name!r} is a {type(leaf).__name__}, not an array")

    def _leaves(self) -> list[Any]:
        from jax import tree_util

        leaves, treedef = tree_util.tree_flatten(self._holder.tree)
        if treedef != self._treedef:
            raise ModelError(
                f"JaxParams.tree changed structure since the session began: {treedef} "
                f"is not {self._treedef}"
            )
        return leaves

    def read(self, names: Sequence[str]) -> list[Any]:
        leaves = self._leaves()
        return [leaves[self._index[n]] for n in names]

    def write(self, values: Mapping[str, Any]) -> None:
        leaves = self._leaves()
        for name, value in values.items():
            leaves[self._index[name]] = value
        self._holder.tree = self._treedef.unflatten(leaves)


class _NnxSlots:
    """The ``nnx.Param`` variables of a module, found by path each time (the module may
    swap a submodule; the variables themselves are updated in place by nnx)."""

    def __init__(self, model: Any) -> None:
        from flax import nnx

        if not isinstance(model, nnx.Module):
            raise ModelError(
                f"{type(model).__name__} is a flax object but not an nnx.Module: pass an "
                "nnx.Module, or a linen model's params as gm_shell.JaxParams(variables['params'])"
            )
        self._model = model
        state = nnx.state(model, nnx.Param)
        paths: list[Path] = [tuple(cast(Path, path)) for path, _ in nnx.to_flat_state(state)]
        self._paths = sorted(paths, key=lambda path: _definition_rank(model, path))
        self.names = _checked(self._paths)
        self._by_name = dict(zip(self.names, self._paths, strict=True))

    def _variable(self, name: str) -> Any:
        node = self._model
        for segment in self._by_name[name]:
            node = _child(node, segment)
        return node

    def read(self, names: Sequence[str]) -> list[Any]:
        return [self._variable(n).get_value() for n in names]

    def write(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            self._variable(name).set_value(value)


def _child(node: Any, segment: str | int) -> Any:
    if isinstance(segment, int) or isinstance(node, Mapping):
        return node[segment]
    return getattr(node, segment)


def _definition_rank(root: Any, path: Path) -> tuple[int, ...]:
    """Each segment's position among its parent's children in the order they were defined:
    an index as itself, a key or an attribute by its place in the mapping or ``vars()``."""
    rank = []
    node = root
    for segment in path:
        if isinstance(segment, int):
            rank.append(segment)
        else:
            keys = list(node.keys() if isinstance(node, Mapping) else vars(node))
            rank.append(keys.index(segment) if segment in keys else len(keys))
        node = _child(node, segment)
    return tuple(rank)


class _JaxFragment:
    """Gathers fetch a fragment's arrays in one ``device_get``; scatters put new arrays with
    the dtype and sharding of those they replace."""

    def __init__(self, layout: Layout, slots: _Slots) -> None:
        self.layout = layout
        self._slots = slots
        self._names = [s.name for s in layout.spans]

    def gather(self, out: F32) -> None:
        import jax

        arrays = jax.device_get(self._slots.read(self._names))
        for span, values in zip(self.layout.spans, arrays, strict=True):
            out[span.start : span.stop] = np.asarray(values).reshape(-1)

    def scatter(self, flat: F32) -> None:
        import jax

        current = self._slots.read(self._names)
        values = {
            span.name: jax.device_put(
                flat[span.start : span.stop].reshape(span.shape).astype(old.dtype, copy=True),
                _placement(old),
            )
            for span, old in zip(self.layout.spans, current, strict=True)
        }
        self._slots.write(values)

    def held(self, flat: F32) -> F32:
        dtypes = [leaf.dtype for leaf in self._slots.read(self._names)]
        lossy = [(s, d) for s, d in zip(self.layout.spans, dtypes, strict=True) if d != np.float32]
        if not lossy:
            return flat
        out = flat.copy()
        for span, dtype in lossy:
            out[span.start : span.stop] = out[span.start : span.stop].astype(dtype)
        return out


def _placement(array: Any) -> Any:
    """Where a new value of ``array`` goes: its sharding (None, the default device, for a
    numpy leaf of a pytree)."""
    return getattr(array, "sharding", None)
