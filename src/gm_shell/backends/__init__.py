"""Compute backends: the numerics of :mod:`gm_core.numerics` over framework buffers.

Theory of operation
-------------------
One protocol (:class:`~gm_shell.backends.protocol.Backend`), three
implementations: numpy (the reference itself), torch and MLX. Framework modules
are imported only when their backend is asked for, so a numpy-only closer never
pays for importing torch.
"""

from __future__ import annotations

from typing import Any

from gm_shell.backends.numpy_backend import NumpyBackend
from gm_shell.backends.protocol import Backend


def backend(name: str, **options: Any) -> Backend[Any]:
    """The backend called ``name`` ("numpy", "torch" or "mlx")."""
    if name == "numpy":
        return NumpyBackend()
    if name == "torch":
        from gm_shell.backends.torch_backend import TorchBackend

        return TorchBackend(**options)
    if name == "mlx":
        from gm_shell.backends.mlx_backend import MlxBackend

        return MlxBackend()
    raise ValueError(f"unknown backend {name!r}; expected numpy, torch or mlx")


__all__ = ["Backend", "NumpyBackend", "backend"]
