"""Quantized commit updates with error feedback.

Theory of operation
-------------------
A closer may publish a commit as a quantized *update* from the previous version,
so followers download a fraction of the bytes. Followers then hold not the true
fp32 parameters ``master`` but a *mirror*: the sum of every update they decoded.
The closer keeps that mirror too, advanced by exactly the decoded update, and
always encodes ``master − mirror``. Whatever one round's quantization lost is
therefore still in the next round's difference: the error is fed back instead of
accumulating, and the followers' copy tracks the master within one round's
quantization error.

Decoding is exact and the mirror update is one IEEE fp32 addition per element,
so every backend's mirror is bit-identical to every follower's copy.
"""

from __future__ import annotations

import numpy as np

from gm_core.numerics.arrays import F32, U8, check_flat
from gm_core.numerics.quant import WireLayout, decode, encode


def publish_update(
    master: F32, mirror: F32, wire: WireLayout, codes: U8, scales: U8, scratch: F32
) -> None:
    """Encode ``master − mirror`` into ``codes``/``scales``; advance ``mirror`` by its decoding."""
    n = wire.layout.total
    for buffer, what in ((master, "master"), (mirror, "mirror"), (scratch, "scratch")):
        check_flat(buffer, n, what)
    np.subtract(master, mirror, out=scratch)
    encode(scratch, wire, codes, scales)
    apply_update(mirror, codes, scales, wire, scratch)


def apply_update(theta: F32, codes: U8, scales: U8, wire: WireLayout, scratch: F32) -> None:
    """A follower's side: ``θ ← θ + decode(update)``."""
    decode(codes, scales, wire, scratch)
    np.add(theta, scratch, out=theta)
