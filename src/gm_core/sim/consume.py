"""Consuming a fixed dataset at the learners' simulated pace: a shared queue against static ranks.

Theory of operation
-------------------
The simulator (:mod:`gm_core.sim.world`) runs the real closer and learner machines and
records when each learner's every step ended (:attr:`gm_core.sim.metrics.Tally.step_ends`):
its own speed, and every stall the protocol put on it (``in_flight`` waiting for commits,
rounds held open by the grace window, ``follow``). This module reads, from those
trajectories, how long a dataset of ``units`` units of ``batches`` steps each would take
to consume, split two ways (issue 13's benchmark):

* **pulled** from one shared queue (:mod:`gm_core.queue`): each learner asks for a unit
  when it has finished its previous one (at its first step at the start), the first to ask
  gets the next unit; a unit is the learner's next ``batches`` steps, plus
  ``overhead_s`` per unit for the queue's own requests at a unit's boundary (the shell
  runs them on the training thread: the check before a unit starts, the one before its
  done marker, the marker, and a share of the listing and claims, one per
  ``1 + prefetch`` units), which delays the learner's later steps by as much;
* **static** ranks (``Session(ranks=N)``): learner ``r`` of the ``N`` (in name order)
  trains units ``r, r + N, …``, with no request between them.

The time is from the first step's start (the earliest learner's first end minus its
mean step time) to the last unit's end. What it leaves out, and says so: the steps are
the ones the simulated run took with every learner training throughout, so the end of
the run, where learners whose share is done leave and the others' rounds change, is the
same for both splits; and which data a step trains on is not modelled, so a loss can only
be read off the committed model at each split's end time, not compared as a verdict.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen(kw_only=True)
class Consumed:
    """How long the dataset took to consume, and how many units each learner trained."""

    took_s: float
    units: Mapping[str, int]


def start_s(ends: Mapping[str, Sequence[float]], step_s: Mapping[str, float]) -> float:
    """When the first step of any learner started (each one's first end less its mean step)."""
    return min(e[0] - step_s[name] for name, e in ends.items() if e)


def _unit_end(ends: Sequence[float], count: int, batches: int, overhead_s: float) -> float:
    """When a learner that has trained ``count`` units finished the last of them."""
    last = count * batches - 1
    if last >= len(ends):
        return math.inf  # the simulated run was too short for this many
    return ends[last] + count * overhead_s


def pulled(
    ends: Mapping[str, Sequence[float]],
    step_s: Mapping[str, float],
    units: int,
    batches: int,
    overhead_s: float = 0.0,
) -> Consumed | None:
    """The shared queue's split: the first learner to ask takes the next unit (ties: by
    name). None when the trajectories end before the dataset does."""
    if units < 1 or batches < 1 or overhead_s < 0:
        raise ValueError(f"units {units}, batches {batches}, overhead {overhead_s}")
    origin = start_s(ends, step_s)
    asking = [(e[0] - step_s[name], name) for name, e in sorted(ends.items()) if e]
    heapq.heapify(asking)
    taken = dict.fromkeys(ends, 0)
    finished = origin
    for _ in range(units):
        _, name = heapq.heappop(asking)
        taken[name] += 1
        end = _unit_end(ends[name], taken[name], batches, overhead_s)
        if math.isinf(end):
            return None
        finished = max(finished, end)
        heapq.heappush(asking, (end, name))
    return Consumed(took_s=finished - origin, units=taken)


def static(
    ends: Mapping[str, Sequence[float]], step_s: Mapping[str, float], units: int, batches: int
) -> Consumed | None:
    """Static ranks: learner ``r`` (in name order) trains every ``N``-th unit from ``r``.
    None when a learner's trajectory ends before its share does."""
    if units < 1 or batches < 1:
        raise ValueError(f"units {units}, batches {batches}")
    names = sorted(ends)
    shares = {name: len(range(r, units, len(names))) for r, name in enumerate(names)}
    origin = start_s(ends, step_s)
    finished = origin
    for name, count in shares.items():
        if count:
            end = _unit_end(ends[name], count, batches, 0.0)
            if math.isinf(end):
                return None
            finished = max(finished, end)
    return Consumed(took_s=finished - origin, units=shares)


def ideal_s(step_s: Mapping[str, float], units: int, batches: int) -> float:
    """The speed-weighted ideal: the dataset's steps over the learners' summed step rates,
    no sync cost and no stall."""
    return units * batches / sum(1 / s for s in step_s.values())
