"""The closer's outer step: Nesterov momentum on the merged delta.

Theory of operation
-------------------
The merged delta ``Δ`` (``anchor − θ``, so it points *away* from the learners)
acts as an outer gradient. Nesterov momentum, as in DiLoCo:

    m ← β·m + Δ
    Θ ← Θ − η·(Δ + β·m)

with the *new* ``m`` in the second line. With ``η = 1, β = 0`` this is
federated averaging: ``Θ − Σ c_i (Θ − θ_i) = Σ c_i θ_i``.

A round made only of final (flush-on-close) contributions carries the last
steps of learners that are leaving; it is applied as the plain merged delta
(``Θ ← Θ − Δ``) and leaves ``m`` untouched, so a departure neither injects
momentum nor is amplified by it.

The element order is fixed (``m·β``, ``+Δ``; ``m·β``, ``+Δ``, ``·η``; ``Θ −``) so
the numpy reference is reproducible bit for bit; other backends may fuse
multiply-adds and so agree within fp32 rounding.
"""

from __future__ import annotations

import numpy as np

from gm_core.numerics.arrays import F32, check_flat
from gm_core.numerics.blocks import BLOCK, blocks


def nesterov_block(theta: F32, momentum: F32, delta: F32, lr: float, beta: float, tmp: F32) -> None:
    """One cached block of the Nesterov step; ``tmp`` is scratch of the same length."""
    b, eta = np.float32(beta), np.float32(lr)
    np.multiply(momentum, b, out=momentum)
    np.add(momentum, delta, out=momentum)
    np.multiply(momentum, b, out=tmp)
    np.add(tmp, delta, out=tmp)
    np.multiply(tmp, eta, out=tmp)
    np.subtract(theta, tmp, out=theta)


def nesterov(theta: F32, momentum: F32, delta: F32, lr: float, beta: float) -> None:
    """Apply ``m ← βm + Δ; Θ ← Θ − η(Δ + βm)`` in place to ``theta`` and ``momentum``."""
    n = theta.shape[0]
    for buffer, what in ((theta, "theta"), (momentum, "momentum"), (delta, "delta")):
        check_flat(buffer, n, what)
    scratch = np.empty(min(BLOCK, n), dtype=np.float32)
    for lo, hi in blocks(0, n):
        nesterov_block(theta[lo:hi], momentum[lo:hi], delta[lo:hi], lr, beta, scratch[: hi - lo])


def outer_step(
    theta: F32, momentum: F32, delta: F32, lr: float, beta: float, *, final_only: bool
) -> None:
    """Commit ``delta`` into ``theta``: Nesterov, or plain ``Θ − Δ`` for a final-only round."""
    if final_only:
        check_flat(delta, theta.shape[0], "delta")
        np.subtract(theta, delta, out=theta)
    else:
        nesterov(theta, momentum, delta, lr, beta)
