"""A learner's replica: its model's fragments, the anchors it trains from, and carry copies.

Theory of operation
-------------------
A learner publishes ``anchor − θ`` for a fragment, where the *anchor* is the
committed value of that fragment it last aligned with. The replica keeps one
flat fp32 host copy of each anchor, and does the two things that must happen
on the training thread, between optimizer steps, at the step the core chose:

- :meth:`Replica.capture` — the delta of one fragment as the model holds it
  now (for ``carry`` alignment it also keeps θ at that moment, since carry
  replays exactly the steps trained after it);
- :meth:`Replica.apply` — fold a committed fragment into the model by the
  run's alignment rule, then make it the new anchor.

``carry`` when this learner took no snapshot of the round (it had not trained
that fragment, or it joined later): the commit's change is laid over the local
progress, ``θ ← θ + (Θ − anchor)``, i.e. carry with the old anchor as the
snapshot. The core then keeps counting steps from the old anchor, so the next
delta ``Θ − θ`` is again exactly the local steps it reports.

The replica never decides anything; it only does what a command asked.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gm_core.numerics import align
from gm_core.numerics.arrays import F32
from gm_core.records import Alignment, FragmentPlan
from gm_shell.models import FragmentAccess, ModelAdapter


class Replica:
    """The training thread's view of the model, fragment by fragment."""

    def __init__(self, model: ModelAdapter, plan: FragmentPlan) -> None:
        self.fragments: Sequence[FragmentAccess] = [model.fragment(n) for n in plan.fragments]
        self._anchors: list[F32 | None] = [None] * len(self.fragments)
        self._taken: dict[int, F32] = {}

    def read(self, fragment: int) -> F32:
        """A fresh host copy of the fragment as the model holds it."""
        access = self.fragments[fragment]
        out = np.empty(access.layout.total, dtype=np.float32)
        access.gather(out)
        return out

    def capture(self, round_: int, fragment: int, keep_copy: bool) -> F32:
        """``anchor − θ`` of ``fragment`` now (a fresh buffer); keeps θ for carry if asked."""
        anchor = self._anchors[fragment]
        assert anchor is not None, "a fragment is captured only after the join loaded it"
        theta = self.read(fragment)
        if keep_copy:
            self._taken[round_] = theta.copy()
        np.subtract(anchor, theta, out=theta)
        return theta

    def forget(self, round_: int) -> None:
        """The snapshot of ``round_`` was never published: carry must not use its copy."""
        self._taken.pop(round_, None)

    def apply(
        self, round_: int, fragment: int, committed: F32, mode: Alignment, mixing: float
    ) -> None:
        """Fold ``committed`` into the model by ``mode``; it becomes the fragment's anchor."""
        access = self.fragments[fragment]
        anchor = self._anchors[fragment]
        if mode is Alignment.OVERWRITE or anchor is None:
            access.scatter(committed)
        else:
            theta = self.read(fragment)
            snapshot = self._taken.get(round_, anchor) if mode is Alignment.CARRY else None
            align(theta, committed, mode, mixing, snapshot)
            access.scatter(theta)
        self._anchors[fragment] = committed
        for old in [r for r in self._taken if r <= round_]:
            del self._taken[old]

    def overwrite_all(self, frontier: Sequence[F32]) -> None:
        """Every fragment takes the committed value (join, close, evaluation)."""
        for fragment, committed in enumerate(frontier):
            self.fragments[fragment].scatter(committed)
            self._anchors[fragment] = committed
