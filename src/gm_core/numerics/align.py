"""How a learner folds a commit ``Θ`` into its own parameters ``θ``.

Theory of operation
-------------------
Three rules, named by :class:`gm_core.records.Alignment`:

* overwrite (DiLoCo): ``θ ← Θ``. Simple; discards the steps trained since the
  snapshot whose round produced ``Θ``.
* blend (Streaming DiLoCo): ``θ ← (1 − α)·θ + α·Θ`` with ``α = mixing``; keeps a
  share of the local progress. ``α = 1`` is overwrite.
* carry (delay-corrected): ``θ ← Θ + (θ_now − θ_at_snapshot)``; keeps exactly the
  steps trained since the snapshot, replayed on top of the commit. It needs the
  parameters as they were when the delta was taken.

All three are elementwise, in place, and use a fixed operation order so the numpy
reference is reproducible bit for bit.
"""

from __future__ import annotations

import numpy as np

from gm_core.numerics.arrays import F32, check_flat
from gm_core.numerics.blocks import BLOCK, blocks
from gm_core.records import Alignment


def align(
    theta: F32,
    committed: F32,
    alignment: Alignment,
    mixing: float = 1.0,
    snapshot: F32 | None = None,
) -> None:
    """Update ``theta`` in place from ``committed`` by ``alignment``."""
    n = theta.shape[0]
    check_flat(theta, n, "theta")
    check_flat(committed, n, "committed")
    if alignment is Alignment.OVERWRITE:
        np.copyto(theta, committed)
    elif alignment is Alignment.BLEND:
        assert 0.0 <= mixing <= 1.0, f"mixing {mixing} outside [0, 1]"
        keep, take = np.float32(1.0 - mixing), np.float32(mixing)
        scratch = np.empty(min(BLOCK, n), dtype=np.float32)
        for lo, hi in blocks(0, n):
            tmp = scratch[: hi - lo]
            np.multiply(theta[lo:hi], keep, out=theta[lo:hi])
            np.multiply(committed[lo:hi], take, out=tmp)
            np.add(theta[lo:hi], tmp, out=theta[lo:hi])
    else:
        assert snapshot is not None, "carry needs the parameters at snapshot time"
        check_flat(snapshot, n, "snapshot")
        np.subtract(theta, snapshot, out=theta)
        np.add(theta, committed, out=theta)
