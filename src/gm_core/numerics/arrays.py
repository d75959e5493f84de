"""Array type names shared by the numerics modules.

Theory of operation
-------------------
Every buffer the numerics touch is flat and contiguous: fp32 for parameters,
momenta and deltas, uint8 for wire codes and scales. Naming the two types once
keeps signatures short and makes the contract visible in every one of them.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]


def check_flat(x: F32, n: int, what: str) -> None:
    """Reject misuse early: a wrong-sized or strided buffer would silently corrupt a merge."""
    assert x.dtype == np.float32, f"{what}: dtype {x.dtype}, expected float32"
    assert x.shape == (n,), f"{what}: shape {x.shape}, expected ({n},)"
    assert x.flags.c_contiguous, f"{what}: not contiguous"
