"""Adaptive alignment: carry while the learners agree, overwrite while they do not.

Theory of operation
-------------------
``carry`` keeps every step a learner trained between its snapshot and the commit (the
commit plus the local progress since); ``overwrite`` drops them. Carrying pays while the
learners' deltas point the same way: the local progress is then a step along the
commit's direction. When they disagree it lays one learner's direction over a commit
that averaged it away. Every round record says how much the round's accepted deltas
agreed: ``cosine``, their mean pairwise cosine, which the closer computes while it
merges. So a run whose rule is ``adaptive`` decides per fragment, from the records of
that fragment in tape order:

* a commit whose cosine is at least ``carry_above`` makes the fragment carry from it on;
* one whose cosine is below ``overwrite_below`` makes it overwrite from it on;
* in between, or without a cosine (a round of fewer than two accepted deltas, or an
  empty one), the fragment keeps what it did: the gap between the thresholds keeps a
  fragment from flapping on a cosine that hovers around one value.

Every fragment starts by carrying (as the reference package's ``Adaptive`` does), and a
learner restarted from scratch starts again so: the mode is a learner's own, never on
the wire. A cosine above 1 (float rounding of two equal deltas) counts as at least
``carry_above``; the codec has already refused what is not a number.
"""

from __future__ import annotations

from gm_core.records import Alignment

INITIAL = Alignment.CARRY
"""The mode of every fragment before any commit has moved it."""


def next_mode(
    previous: Alignment, cosine: float | None, carry_above: float, overwrite_below: float
) -> Alignment:
    """The fragment's mode once a commit whose round recorded ``cosine`` is folded in."""
    if cosine is None:
        return previous
    if cosine < overwrite_below:
        return Alignment.OVERWRITE
    if cosine >= carry_above:
        return Alignment.CARRY
    return previous
