"""A poisoned-but-finite learner: every delta it publishes is multiplied by a factor.

The robust-merge measurements (:mod:`bench.bench_robust`) and the runtime test of
outlier rejection need a learner that trains like the others but sends ``100·Δ``
(a scaled-up delta, as a unit bug or an attacker would) or ``−Δ`` (sign-flipped).
Such a learner is a modified gm: this module modifies it, in its own process only,
by wrapping the payload codec so that delta payloads are scaled just before they
are encoded. Its own model trains unpoisoned; nothing else about the node changes.
``python -m bench.poison RUN_DIR INDEX FACTOR`` runs demo learner INDEX so poisoned.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from gm_core.numerics.arrays import F32
from gm_core.records import PayloadRef
from gm_shell.demo import learner_proc
from gm_shell.fragments import FragmentCodec, Role


def scale_published_deltas(factor: float) -> None:
    """From now on, in this process, every delta payload carries ``factor`` times the delta."""
    encode = FragmentCodec.encode
    scale = np.float32(factor)

    def poisoned(
        self: FragmentCodec,
        fragment: int,
        role: Role,
        round_: int,
        x: F32,
        *,
        minus: F32 | None = None,
    ) -> tuple[bytes, PayloadRef]:
        if role is Role.DELTA:
            x = np.multiply(x if minus is None else np.subtract(x, minus), scale, dtype=np.float32)
        return encode(self, fragment, role, round_, x)

    FragmentCodec.encode = poisoned  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.poison RUN_DIR INDEX FACTOR``: demo learner INDEX, poisoned."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m bench.poison RUN_DIR INDEX FACTOR", file=sys.stderr)
        return 2
    scale_published_deltas(float(args[2]))
    return learner_proc.main(args[:2])


if __name__ == "__main__":
    sys.exit(main())
