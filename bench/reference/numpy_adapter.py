"""A numpy backend for the reference package, so the benchmark can drive it without torch.

gradientmail 0.0.2 ships torch and MLX backends only, and no CPU torch wheel for Python 3.12
is available offline here. Its ``Backend`` protocol is small: ``adapter`` (we hand the
sessions its own ``MemoryAdapter`` instead of a framework model), ``load`` (bytes to an fp32
value), ``dequantize`` and a ``Value`` type with the few fp32 operations its outer step uses.
This module implements that protocol over numpy arrays, operation for operation as its
framework backends do: every operation returns a new fp32 array.

Only what the benchmark exercises is implemented: parameters and deltas in F32, F16 or BF16.
The quantized wire formats (F8_E4M3, F4) raise ``NotImplementedError``; no figure uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from gradientmail.adapters import Adapter, MemoryAdapter
from gradientmail.serialization import DType, Schema, TensorBytes

_LE_F32 = np.dtype("<f4")
_LE_F16 = np.dtype("<f2")
_LE_U16 = np.dtype("<u2")


def to_f32(tensor: TensorBytes) -> np.ndarray:
    """The fp32 array a ``TensorBytes`` of a parameter dtype holds (a read-only view for F32)."""
    if tensor.dtype == "F32":
        return np.frombuffer(tensor.data, dtype=_LE_F32).reshape(tensor.shape)
    if tensor.dtype == "F16":
        return np.frombuffer(tensor.data, dtype=_LE_F16).astype(np.float32).reshape(tensor.shape)
    if tensor.dtype == "BF16":
        high = np.frombuffer(tensor.data, dtype=_LE_U16).astype(np.uint32) << 16
        return high.view(np.float32).reshape(tensor.shape)
    raise ValueError(f"{tensor.dtype} bytes need their scales (quantized formats: not supported)")


def from_f32(array: np.ndarray, dtype: str) -> TensorBytes:
    """``array`` rounded to ``dtype`` (nearest even) as little-endian bytes."""
    flat = np.ascontiguousarray(array, dtype=np.float32)
    shape = tuple(int(n) for n in array.shape)
    if dtype == "F32":
        return TensorBytes("F32", shape, flat.astype(_LE_F32, copy=False).tobytes())
    if dtype == "F16":
        return TensorBytes("F16", shape, flat.astype(_LE_F16).tobytes())
    if dtype == "BF16":
        bits = flat.view(np.uint32)
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
        return TensorBytes("BF16", shape, rounded.astype(_LE_U16).tobytes())
    raise NotImplementedError(f"numpy adapter: no {dtype} encoding (not used by the benchmark)")


class NumpyValue:
    """An fp32 numpy array with the arithmetic of the reference's ``Value`` protocol."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __add__(self, other: NumpyValue) -> NumpyValue:
        return NumpyValue(self.data + other.data)

    def __sub__(self, other: NumpyValue) -> NumpyValue:
        return NumpyValue(self.data - other.data)

    def __mul__(self, scalar: float) -> NumpyValue:
        return NumpyValue(self.data * np.float32(scalar))

    def norm(self) -> float:
        flat = self.data.reshape(-1)
        return float(np.sqrt(np.dot(flat, flat)))

    def dot(self, other: NumpyValue) -> float:
        return float(np.dot(self.data.reshape(-1), other.data.reshape(-1)))

    def to_bytes(self, dtype: str) -> TensorBytes:
        return from_f32(self.data, dtype)

    def quantize(self, dtype: str) -> tuple[TensorBytes, TensorBytes]:
        raise NotImplementedError(f"numpy adapter: no {dtype} quantization (not benchmarked)")


class NumpyBackend:
    """The reference's ``Backend`` protocol over numpy; models are given as its ``Adapter``s."""

    def adapter(self, model: object) -> Adapter:
        if isinstance(model, Adapter):
            return model
        raise TypeError(f"the numpy backend takes an Adapter, not {type(model).__qualname__}")

    def load(self, tensor: TensorBytes) -> NumpyValue:
        return NumpyValue(to_f32(tensor))

    def dequantize(
        self, data: TensorBytes, scale: TensorBytes, shape: tuple[int, ...]
    ) -> NumpyValue:
        raise NotImplementedError("numpy adapter: quantized deltas are not benchmarked")


class ArrayAdapter(Adapter):
    """The reference's ``Adapter`` over mutable fp32 arrays: a model whose snapshots copy.

    The reference's own ``MemoryAdapter`` holds immutable bytes, so its ``snapshot`` hands
    out references and copies nothing, while a learner over a real model copies the
    fragment at its due step (its torch adapter makes bytes of every tensor, one copy
    each). This adapter does what that torch adapter does, over numpy: ``snapshot`` copies
    each array into new bytes, ``apply`` writes the committed bytes into the arrays in
    place; so a benchmark of due steps has both packages copy the same bytes (gm copies the
    fragment from its torch model into a buffer).
    """

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._arrays = {name: np.array(array, dtype=np.float32) for name, array in arrays.items()}
        self._schema = MemoryAdapter(tensors_of(arrays)).schema()
        self.applied = 0
        """Calls of :meth:`apply` (commits written into the model), for bench_step.py."""

    def schema(self) -> Schema[DType]:
        return self._schema

    def snapshot(self, names: Iterable[str]) -> Mapping[str, TensorBytes]:
        arrays = self._arrays
        return {
            name: TensorBytes("F32", arrays[name].shape, arrays[name].tobytes()) for name in names
        }

    def apply(self, tensors: Mapping[str, TensorBytes]) -> None:
        self.applied += 1
        for name, tensor in tensors.items():
            np.copyto(self._arrays[name], to_f32(tensor))


def tensors_of(arrays: Mapping[str, np.ndarray]) -> dict[str, TensorBytes]:
    """fp32 arrays as the reference's ``TensorBytes``, by name."""
    return {name: from_f32(array, "F32") for name, array in arrays.items()}
