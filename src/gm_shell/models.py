"""Model adapters: a torch or MLX model's parameters as flat fp32 fragments on the host.

Theory of operation
-------------------
The protocol sees a model as a schema (name, shape, dtype of every parameter)
dealt into fragments by the run's plan; the numerics see a fragment as one flat
contiguous fp32 buffer (:class:`gm_core.numerics.Layout`). An adapter bridges
the two for one framework, and does only two things, both on the training
thread, between two optimizer steps:

- :meth:`FragmentAccess.gather` copies a fragment's parameters into a flat fp32
  host buffer (converting bf16/fp16 parameters to fp32, and device to host);
- :meth:`FragmentAccess.scatter` writes a flat fp32 buffer back into the
  parameters (converting back to each parameter's own dtype and device).

Everything else — deltas, encoding, hashing, alignment arithmetic — happens on
host buffers the adapter never sees, so the training loop only pays for these
copies, and only at the steps where a round needs them. Parameters are the
framework's own list (``named_parameters()`` in torch, ``parameters()`` in MLX),
buffers such as batch-norm statistics are not synchronized.

Names are canonical: the same model has the same schema however a node wraps it
for its own training, so wrapped and plain nodes join one run. A torch model is
unwrapped from ``DistributedDataParallel``/``DataParallel`` (``module.``, also
what accelerate's ``prepare`` returns) and ``torch.compile`` (``_orig_mod.``),
and the segments torch's wrappers insert inside names (``_orig_mod`` of a
compiled submodule, FSDP's ``_fsdp_wrapped_module``, activation checkpointing's
``_checkpoint_wrapped_module``) are dropped: torch reserves them, no model names
its own parameters so. accelerate's ``prepare`` returns one of these wrappers (DDP
across processes, FSDP with its plugin) or the model itself. FSDP must leave each
parameter whole in the process that runs the ``Session``: ``use_orig_params=True``
(not its flat parameter) and no sharding across ranks (``NO_SHARD``, or one rank);
FSDP2's ``fully_shard`` parameters are DTensors, read through their local tensor
when it holds the whole parameter. Anything else is refused by name.

What a run synchronizes is a choice (:data:`Sync`): by default the *trainable*
parameters (torch ``requires_grad``, MLX ``trainable_parameters()``), so a LoRA
run ships its adapters alone; or the names a regular expression matches. The
other parameters are *frozen*: the adapter pins each by a digest of its values
(:meth:`ModelAdapter.frozen`), checked once when a node joins, never shipped.

Precision: gathers and scatters convert each parameter's own dtype to fp32 and
back. :meth:`FragmentAccess.held` says what a parameter holds after a scatter
(fp32 values rounded to its dtype), so the replica can anchor deltas at exactly
what the model holds and a learner's rounding never shows up as training.

Frameworks are imported only when a model of theirs is adapted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from gm_core.manifest import wire_schema
from gm_core.numerics.arrays import F32
from gm_core.numerics.layout import Layout
from gm_core.records import FrozenTensor, TensorSpec
from gm_shell.payload import content_hash
from gm_shell.staging import CudaStage, copy_tensors, cuda_device


class ModelError(TypeError):
    """The object cannot be trained by gm as given (unknown framework, unsupported dtype)."""


class FragmentAccess(Protocol):
    """Copies between one fragment's parameters and a flat fp32 host buffer."""

    layout: Layout

    def gather(self, out: F32) -> None:
        """``out`` (length ``layout.total``) receives the parameters, in layout order."""
        ...

    def scatter(self, flat: F32) -> None:
        """The parameters take the values of ``flat``."""
        ...

    def held(self, flat: F32) -> F32:
        """``flat`` as the parameters would hold it (rounded to their dtypes); may be ``flat``."""
        ...


Sync = str | Collection[str] | None
"""Which parameters a run synchronizes: None, the trainable ones; a ``str``, those whose
canonical name the regular expression matches (``re.search``); a collection, those names."""


class ModelAdapter(Protocol):
    framework: str

    def schema(self) -> tuple[TensorSpec, ...]:
        """The synchronized parameters, in the framework's order, as the wire carries them."""
        ...

    def held(self) -> tuple[TensorSpec, ...]:
        """The synchronized parameters with the dtypes the model holds them in."""
        ...

    def frozen(self) -> tuple[FrozenTensor, ...]:
        """Every other parameter, pinned by the digest of its values (reads them all)."""
        ...

    def fragment(self, names: Sequence[str]) -> FragmentAccess:
        """Access to the parameters ``names`` laid out back to back in that order."""
        ...


def adapt(model: Any, sync: Sync = None) -> ModelAdapter:
    """The adapter for ``model``: a ``torch.nn.Module``, an ``mlx.nn.Module``, a flax
    ``nnx.Module`` or a pytree of JAX arrays in a ``gm_shell.JaxParams``."""
    from gm_shell import jax_model  # imports no JAX itself

    if framework(model) == "torch":
        return TorchModel(model, sync)
    if framework(model) == "mlx":
        return MlxModel(model, sync)
    if jax_model.is_jax_model(model):
        return jax_model.JaxModel(model, sync)
    raise ModelError(
        f"{type(model).__name__} is neither a torch.nn.Module, an mlx.nn.Module, a flax "
        "nnx.Module nor a gm_shell.JaxParams; gm trains the parameters of one of those "
        "(a pytree of JAX arrays is immutable: wrap it in JaxParams)"
    )


def framework(model: Any) -> str | None:
    """``torch`` or ``mlx`` where ``model`` is such a module (by its classes' packages,
    importing neither), else None."""
    modules = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    return next((name for name in ("torch", "mlx") if name in modules), None)


def _split(params: Iterable[tuple[str, bool]], sync: Sync) -> tuple[list[str], list[str]]:
    """(synchronized, frozen) names, in the framework's order; refuses to sync nothing."""
    synced: list[str] = []
    frozen: list[str] = []
    pattern = re.compile(sync) if isinstance(sync, str) else None
    chosen = None if sync is None or isinstance(sync, str) else set(sync)
    for name, trainable in params:
        if pattern is not None:
            take = pattern.search(name) is not None
        elif chosen is not None:
            take = name in chosen
        else:
            take = trainable
        (synced if take else frozen).append(name)
    if not synced:
        what = "no parameter is trainable" if sync is None else f"sync={sync!r} selects nothing"
        raise ModelError(f"{what}: a run needs at least one parameter to synchronize")
    if chosen is not None and chosen - set(synced):
        raise ModelError(f"the model has no parameters named {sorted(chosen - set(synced))}")
    return synced, frozen


def _frozen_tensor(name: str, values: F32) -> FrozenTensor:
    data = np.ascontiguousarray(values, dtype="<f4").reshape(-1).view(np.uint8)
    return FrozenTensor(name=name, shape=tuple(values.shape), digest=content_hash(data))


def _layout(specs: dict[str, TensorSpec], names: Sequence[str]) -> Layout:
    missing = [n for n in names if n not in specs]
    if missing:
        raise ModelError(f"the model has no parameters named {missing}")
    return Layout.from_specs(specs[n] for n in names)


# -- torch ------------------------------------------------------------------------------------

_TORCH_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


WRAPPER_SEGMENTS = frozenset(
    {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_dmp_wrapped_module"}
)
"""Name segments torch's wrappers insert; a canonical name has none of them."""


def canonical_name(name: str) -> str:
    """``name`` without the segments wrappers insert (``_orig_mod.fc.weight`` -> ``fc.weight``)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def unwrap_torch(model: Any) -> Any:
    """The module a DDP/DataParallel or ``torch.compile`` wrapper holds (repeatedly)."""
    import torch

    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _refuse_sharded_fsdp(model: Any) -> None:
    """FSDP (``FullyShardedDataParallel``) that shards over several ranks holds a slice of each
    parameter here, shaped unlike the model's: refused, naming what works."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return  # no process group, no sharding (and no import of FSDP for a plain model)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    for module in model.modules():
        if not isinstance(module, FullyShardedDataParallel):
            continue
        if module.world_size > 1 and module.sharding_strategy is not ShardingStrategy.NO_SHARD:
            raise ModelError(
                f"FSDP shards this model over {module.world_size} ranks "
                f"({module.sharding_strategy.name}), so this process holds slices of its "
                "parameters; a Session needs whole parameters: use "
                "sharding_strategy=ShardingStrategy.NO_SHARD or DDP"
            )


def _whole(name: str, p: Any) -> Any:
    """The tensor gm reads and writes for parameter ``name``: the parameter itself, or the
    local tensor of a DTensor (FSDP2's ``fully_shard``) that holds all of it; a flat or
    sharded parameter is refused by name."""
    if getattr(p, "_is_flat_param", False):
        raise ModelError(
            f"{name!r} is FSDP's flat parameter, not one of the model's: wrap the model with "
            "FullyShardedDataParallel(..., use_orig_params=True)"
        )
    to_local = getattr(p, "to_local", None)
    if to_local is None:
        return p
    local = to_local()
    if tuple(local.shape) != tuple(p.shape):
        raise ModelError(
            f"{name!r} is sharded: this process holds {tuple(local.shape)} of "
            f"{tuple(p.shape)}; a Session needs whole parameters (fully_shard over one rank, "
            "or DDP)"
        )
    return local


class TorchModel:
    """A ``torch.nn.Module``'s ``named_parameters()``, unwrapped, by canonical name."""

    framework = "torch"
    _take = staticmethod(_whole)
    """The tensor read and written for a parameter (a group's adapter takes DTensors whole)."""

    def __init__(self, model: Any, sync: Sync = None) -> None:
        model = unwrap_torch(model)
        _refuse_sharded_fsdp(model)
        params: dict[str, Any] = {}
        trainable: dict[str, bool] = {}
        for name, p in model.named_parameters():
            canonical = canonical_name(name)
            if canonical in params:
                raise ModelError(f"parameters {name!r} and {canonical!r} share one canonical name")
            params[canonical] = self._take(name, p)
            trainable[canonical] = p.requires_grad
        synced, frozen = _split(trainable.items(), sync)
        self._params = {n: params[n] for n in synced}
        self._frozen = {n: params[n] for n in frozen}
        self._specs = {name: _torch_spec(name, p) for name, p in self._params.items()}

    def schema(self) -> tuple[TensorSpec, ...]:
        return wire_schema(self.held())

    def held(self) -> tuple[TensorSpec, ...]:
        return tuple(self._specs.values())

    def frozen(self) -> tuple[FrozenTensor, ...]:
        import torch

        return tuple(
            _frozen_tensor(n, p.detach().to("cpu", torch.float32).numpy())
            for n, p in self._frozen.items()
        )

    def fragment(self, names: Sequence[str]) -> FragmentAccess:
        return _TorchFragment(_layout(self._specs, names), [self._params[n] for n in names])


def _torch_spec(name: str, p: Any) -> TensorSpec:
    dtype = _TORCH_DTYPES.get(str(p.dtype).removeprefix("torch."))
    if dtype is None:
        raise ModelError(f"parameter {name!r} has dtype {p.dtype}; gm trains float parameters")
    return TensorSpec(name=name, shape=tuple(p.shape), dtype=dtype)


STAGING_BYTES = 8 << 20
"""Fragments up to this size are copied through a staging buffer made once (below)."""


class _TorchFragment:
    """CPU fp32 contiguous parameters (the common CPU case) are copied byte for byte through
    memoryviews of their own memory: a plain ``memcpy`` that keeps the GIL, so the training
    thread cannot lose it to another thread halfway through a step (torch and numpy copies
    release it, and winning it back can take as long as the other thread's Python work).
    The views are rebuilt whenever a parameter's storage moved (``p.data = …``, ``.to()``):
    :meth:`gather` and :meth:`scatter` check every parameter's ``data_ptr()`` first. A planned
    due step copies without that check (:meth:`copy_bound`: the first torch call after a
    training step costs ~15 us of cold code, more than the copy) and its copy is checked
    after the fact instead (:meth:`bound_to`, see :class:`DirectCopy`).

    Other parameters go through torch: small fragments through a staging buffer whose
    per-tensor views are made once (torch's per-call overhead — making views, entering
    no-grad — costs more than copying them), large ones viewed in place. CPU fp32 moves in
    one fused ``_foreach_copy_``; others (bf16, MPS) tensor by tensor, converting dtype and
    device on the way. CUDA parameters go through a :class:`~gm_shell.staging.CudaStage`:
    one transfer per fragment each way, through pinned memory."""

    def __init__(self, layout: Layout, params: list[Any]) -> None:
        self.layout = layout
        self._params = params
        self._bytes = [(4 * s.start, 4 * s.stop) for s in layout.spans]
        self._binding: Binding = UNBOUND
        """The parameters' data pointers, and byte views of their memory (None where torch
        must copy); replaced whole (one attribute: a reader on another thread sees either)."""
        self._staging: F32 | None = None
        self._staged: list[Any] = []
        self._cuda: CudaStage | None = None

    def _direct_views(self) -> list[memoryview] | None:
        """Byte views of the parameters' memory, or None where torch must do the copy."""
        pointers = tuple(map(_data_ptr(), self._params))
        if pointers != self._binding[0]:
            self._binding = (pointers, _host_bytes(self._params))
        return self._binding[1]

    def slots(self, out: F32) -> list[memoryview] | None:
        """Byte views of ``out``, one per parameter, if the fragment is copied directly
        (any thread: no torch)."""
        if self._binding[1] is None:
            return None
        flat = out.data.cast("B")
        return [flat[lo:hi] for lo, hi in self._bytes]

    def copy_bound(self, slots: list[memoryview]) -> tuple[int, ...] | None:
        """Copy the parameters into ``slots`` through the views bound last, unchecked; the
        data pointers those views were bound to (None: not bound, nothing copied)."""
        pointers, direct = self._binding
        if direct is None:
            return None
        for slot, param in zip(slots, direct, strict=True):
            slot[:] = param
        return pointers

    def bound_to(self, pointers: tuple[int, ...]) -> bool:
        """Whether the parameters still sit at ``pointers``; if not, the views are dropped
        (the next copy binds afresh, checked). Reads only the pointers, under the GIL, like
        the Python code that moves a parameter (``p.data = …``), so any thread may ask."""
        if tuple(map(_data_ptr(), self._params)) == pointers:
            return True
        if self._binding[0] == pointers:
            self._binding = UNBOUND
        return False

    def _views(self, flat: F32) -> list[Any]:
        import torch

        host = torch.from_numpy(flat)
        return [host[s.start : s.stop].view(s.shape) for s in self.layout.spans]

    def _staged_views(self) -> list[Any]:
        if self._staging is None and 4 * self.layout.total <= STAGING_BYTES:
            self._staging = np.empty(self.layout.total, dtype=np.float32)
            self._staged = self._views(self._staging)
        return self._staged

    def gather(self, out: F32) -> None:
        direct = self._direct_views()
        if direct is not None:
            flat = out.data.cast("B")
            for (lo, hi), param in zip(self._bytes, direct, strict=True):
                flat[lo:hi] = param
            return
        if self._params[0].is_cuda and (stage := self._cuda_stage()) is not None:
            stage.gather(self._params, out)
            return
        staged = self._staged_views()
        copy_tensors(staged or self._views(out), self._params)
        if self._staging is not None:
            np.copyto(out, self._staging)

    def scatter(self, flat: F32) -> None:
        direct = self._direct_views()
        if direct is not None:
            source = flat.data.cast("B")
            for (lo, hi), param in zip(self._bytes, direct, strict=True):
                param[:] = source[lo:hi]
            return
        if self._params[0].is_cuda and (stage := self._cuda_stage()) is not None:
            stage.scatter(self._params, flat)
            return
        staged = self._staged_views()
        if self._staging is not None:
            np.copyto(self._staging, flat)
        copy_tensors(self._params, staged or self._views(flat))

    def held(self, flat: F32) -> F32:
        return torch_held(self.layout, self._params, flat)

    def host_arrays(self) -> list[F32] | None:
        """The parameters' own memory as flat fp32 arrays, one per span, where they are CPU
        fp32 contiguous (None: only :meth:`gather` and :meth:`scatter` reach them)."""
        direct = self._direct_views()
        if direct is None:
            return None
        return [np.frombuffer(view, dtype=np.float32) for view in direct]

    def _cuda_stage(self) -> CudaStage | None:
        """The fragment's device and pinned buffers, if its parameters are on one CUDA device."""
        if self._cuda is None or self._cuda.device != self._params[0].device:
            device = cuda_device(self._params)
            self._cuda = None if device is None else CudaStage(self.layout, device)
        return self._cuda


Binding = tuple[tuple[int, ...], list[memoryview] | None]
UNBOUND: Binding = ((), None)


def _data_ptr() -> Callable[[Any], int]:
    """``Tensor.data_ptr`` unbound (``map`` calls it without a Python frame per parameter)."""
    import torch

    return cast(Callable[[Any], int], torch.Tensor.data_ptr)


@runtime_checkable
class DirectCopy(Protocol):
    """A fragment whose parameters a planned due step copies through views bound earlier.

    The binding is checked after the copy, not before (:meth:`bound_to`, by the loop before
    the copy is published): a parameter cannot move back to the memory it left while the
    views hold that memory alive, so pointers unchanged after the copy were unchanged during
    it — unless the training code moved a parameter away and back to the very same tensor
    around that ``step()``, which this check cannot see."""

    def slots(self, out: F32) -> list[memoryview] | None: ...

    def copy_bound(self, slots: list[memoryview]) -> tuple[int, ...] | None: ...

    def bound_to(self, pointers: tuple[int, ...]) -> bool: ...


@runtime_checkable
class InPlace(Protocol):
    """A fragment whose parameters numpy can update where they are (a commit folded in
    without a fragment-sized copy: :meth:`gm_shell.replica.Replica.apply`)."""

    def host_arrays(self) -> list[F32] | None: ...


def torch_held(layout: Layout, params: Sequence[Any], flat: F32) -> F32:
    """``flat`` rounded to the dtypes of ``params`` (laid out by ``layout``); may be ``flat``."""
    import torch

    lossy = [(s, p.dtype) for s, p in zip(layout.spans, params, strict=True)]
    lossy = [(s, dtype) for s, dtype in lossy if dtype != torch.float32]
    if not lossy:
        return flat
    out = flat.copy()
    for span, dtype in lossy:
        view = torch.from_numpy(out[span.start : span.stop])
        view.copy_(view.to(dtype))
    return out


def _host_bytes(params: list[Any]) -> list[memoryview] | None:
    """Writable byte views of CPU fp32 contiguous parameters (None unless all are)."""
    import torch

    if not all(
        p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous() for p in params
    ):
        return None
    return [memoryview(p.detach().numpy().reshape(-1)).cast("B") for p in params]


# -- MLX ----------------------------------------------------------------------------------------

_MLX_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


class MlxModel:
    """An ``mlx.nn.Module``'s ``parameters()``, flattened to dotted names."""

    framework = "mlx"

    def __init__(self, model: Any, sync: Sync = None) -> None:
        self._model = model
        arrays = _mlx_arrays(model)
        trainable = _mlx_arrays(model, trainable=True)
        synced, self._frozen = _split(((n, n in trainable) for n in arrays), sync)
        self._specs = {name: _mlx_spec(name, arrays[name]) for name in synced}

    def schema(self) -> tuple[TensorSpec, ...]:
        return wire_schema(self.held())

    def held(self) -> tuple[TensorSpec, ...]:
        return tuple(self._specs.values())

    def frozen(self) -> tuple[FrozenTensor, ...]:
        import mlx.core as mx

        arrays = _mlx_arrays(self._model)
        return tuple(
            _frozen_tensor(n, np.asarray(arrays[n].astype(mx.float32))) for n in self._frozen
        )

    def fragment(self, names: Sequence[str]) -> FragmentAccess:
        return _MlxFragment(_layout(self._specs, names), self._model)


def _mlx_arrays(model: Any, trainable: bool = False) -> dict[str, Any]:
    """The module's (trainable) parameters by dotted name, in MLX's order."""
    from mlx.utils import tree_flatten

    tree = model.trainable_parameters() if trainable else model.parameters()
    return dict(cast(list[tuple[str, Any]], tree_flatten(tree)))


def _mlx_spec(name: str, a: Any) -> TensorSpec:
    dtype = _MLX_DTYPES.get(str(a.dtype).removeprefix("mlx.core."))
    if dtype is None:
        raise ModelError(f"parameter {name!r} has dtype {a.dtype}; gm trains float parameters")
    return TensorSpec(name=name, shape=tuple(a.shape), dtype=dtype)


class _MlxFragment:
    """MLX arrays are immutable values: scatter rebinds the module's parameters."""

    def __init__(self, layout: Layout, model: Any) -> None:
        self.layout = layout
        self._model = model

    def gather(self, out: F32) -> None:
        import mlx.core as mx

        current = _mlx_arrays(self._model)
        for span in self.layout.spans:
            values = current[span.name].astype(mx.float32).reshape(-1)
            out[span.start : span.stop] = np.asarray(values)

    def held(self, flat: F32) -> F32:
        import mlx.core as mx

        dtypes = {name: a.dtype for name, a in _mlx_arrays(self._model).items()}
        lossy = [s for s in self.layout.spans if dtypes[s.name] != mx.float32]
        if not lossy:
            return flat
        out = flat.copy()
        for span in lossy:
            rounded = mx.array(out[span.start : span.stop]).astype(dtypes[span.name])
            out[span.start : span.stop] = np.asarray(rounded.astype(mx.float32))
        return out

    def scatter(self, flat: F32) -> None:
        import mlx.core as mx

        dtypes = {name: a.dtype for name, a in _mlx_arrays(self._model).items()}
        weights = [
            (
                span.name,
                mx.array(flat[span.start : span.stop].reshape(span.shape)).astype(
                    dtypes[span.name]
                ),
            )
            for span in self.layout.spans
        ]
        self._model.load_weights(weights, strict=False)
        mx.eval(self._model.parameters())
