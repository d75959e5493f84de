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
  gets the next unit; a unit is the learner's next ``batches`` steps, plus the queue's own
  requests, in two parts: ``overhead_s`` per unit on the training thread (a shell that
  sends them between units), and ``behind_s`` per unit sent in the background while the
  unit trains (``Session.run``'s pipelined consumer: the previous unit's done marker, the
  claim ahead and its check), which delays the next unit only by what the unit's own
  training does not cover. ``first_s`` is the first unit's requests, on the training
  thread in both shells (nothing was claimed ahead). Every delay moves the learner's later
  steps by as much;
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


def _unit_span(ends: Sequence[float], first_s: float, count: int, batches: int) -> float:
    """How long a learner's ``count``-th unit trained, on its trajectory (``first_s``: when
    its first step started)."""
    start = first_s if count == 1 else ends[(count - 1) * batches - 1]
    return ends[count * batches - 1] - start


def pulled(
    ends: Mapping[str, Sequence[float]],
    step_s: Mapping[str, float],
    units: int,
    batches: int,
    overhead_s: float = 0.0,
    *,
    behind_s: float = 0.0,
    first_s: float = 0.0,
) -> Consumed | None:
    """The shared queue's split: the first learner to ask takes the next unit (ties: by
    name). None when the trajectories end before the dataset does."""
    if units < 1 or batches < 1 or min(overhead_s, behind_s, first_s) < 0:
        raise ValueError(
            f"units {units}, batches {batches}, overhead {overhead_s}, behind {behind_s}, "
            f"first {first_s}"
        )
    origin = start_s(ends, step_s)
    asking = [(e[0] - step_s[name], name) for name, e in sorted(ends.items()) if e]
    heapq.heapify(asking)
    taken = dict.fromkeys(ends, 0)
    lag = dict.fromkeys(ends, first_s)
    """Per learner, how far the queue's requests have moved its steps so far."""
    finished = origin
    for _ in range(units):
        _, name = heapq.heappop(asking)
        taken[name] += 1
        end = _unit_end(ends[name], taken[name], batches, overhead_s)
        if math.isinf(end):
            return None
        first = ends[name][0] - step_s[name]
        span = _unit_span(ends[name], first, taken[name], batches)
        lag[name] += max(0.0, behind_s - span)
        end += lag[name]
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
