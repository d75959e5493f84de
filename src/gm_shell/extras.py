"""Optional dependencies: a feature that needs one says which extra to install, before it starts.

Theory of operation
-------------------
``pip install gm-diloco`` gives the library and the ``gm`` command with their
small core dependencies; torch, MLX and matplotlib come with extras
(:data:`EXTRAS`). A feature calls :func:`require` with the modules it needs
before any work (a run folder, a process, minutes of training), and gets one
:class:`MissingExtraError` naming every missing module and the ``pip install``
line that adds them. Modules are imported, not only looked up, so a broken
install is caught here too; the demo imports them next anyway.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

DISTRIBUTION = "gm-diloco"
"""The distribution name on PyPI (the import packages are gm_core and gm_shell)."""

EXTRAS: dict[str, str] = {
    "torch": "torch",
    "matplotlib": "plot",
    "mlx": "mlx",
    "transformers": "hf",
    "lightning": "lightning",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "cryptography": "nodekeys",
}
"""The extra that installs each optional module."""

TORCH_CPU = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
"""Without an index, pip picks the CUDA build of torch on Linux (gigabytes)."""


class MissingExtraError(ImportError):
    """A feature needs modules that are not installed; the message says what to install."""


def missing(modules: Sequence[str]) -> list[str]:
    """The modules of ``modules`` that cannot be imported here."""
    absent = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            absent.append(name)
    return absent


def require(feature: str, modules: Sequence[str], extra: str | None = None) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``modules`` imports.

    ``extra`` names the extra that brings them all (default: the union of each
    module's own extra).
    """
    absent = missing(modules)
    if not absent:
        return
    extras = extra or ",".join(sorted({EXTRAS[m] for m in absent}))
    hint = f" (for the CPU-only torch wheel, first: {TORCH_CPU})" if "torch" in absent else ""
    raise MissingExtraError(
        f"{feature} needs {' and '.join(absent)}, not installed here:"
        f" pip install '{DISTRIBUTION}[{extras}]'{hint}"
    )
