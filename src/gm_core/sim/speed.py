"""Learner speeds, the fault schedule, and when each of a learner's next steps ends.

Theory of operation
-------------------
Everything that decides *when* a step ends is known before the run starts: each
learner's mean step time (heterogeneous hardware, :class:`SpeedProfile`), and the
intervals in which it is slowed or paused (the fault schedule, explicit faults
plus those drawn from the seed). So the world can plan a whole stretch of steps
at once — up to the next step the learner's core cares about — as a vector of
end times, and look up how far a learner got at any moment with a binary search
instead of one event per step.

A step that would start inside a pause starts when the pause ends; a step that
starts inside a slow interval takes ``factor`` times longer. Per-step jitter is
drawn from the learner's own generator, so one learner's schedule never shifts
another's.
"""

from __future__ import annotations

import bisect
import math

import attrs
import numpy as np
from numpy.typing import NDArray

from gm_core.sim.scenario import Fault, FaultKind, RandomFaults, Scenario, SpeedProfile


def learner_names(n: int) -> tuple[str, ...]:
    width = max(2, len(str(n - 1)))
    return tuple(f"l{i:0{width}d}" for i in range(n))


def closer_names(scenario: Scenario) -> tuple[str, ...]:
    if scenario.colocate:
        return learner_names(scenario.learners)[: scenario.closers]
    return tuple(f"c{i}" for i in range(scenario.closers))


def mean_step_s(
    profile: SpeedProfile, learners: int, rng: np.random.Generator
) -> tuple[float, ...]:
    """Each learner's mean step time: the slow share first, then a lognormal spread."""
    slow = round(profile.slow_share * learners)
    spread = rng.standard_normal(learners) * profile.spread
    return tuple(
        profile.step_s * (profile.slow_factor if i < slow else 1.0) * math.exp(float(spread[i]))
        for i in range(learners)
    )


def random_faults(
    spec: RandomFaults,
    nodes: tuple[str, ...],
    learners: frozenset[str],
    horizon_s: float,
    rng: np.random.Generator,
) -> tuple[Fault, ...]:
    """Poisson arrivals per node and kind, exponential durations, in a fixed draw order."""
    kinds = (
        (FaultKind.CRASH, spec.crash_per_h, spec.down_s, 1.0),
        (FaultKind.SLOW, spec.slow_per_h, spec.slow_s, spec.slow_factor),
        (FaultKind.CUTOFF, spec.cutoff_per_h, spec.cutoff_s, 1.0),
        (FaultKind.PAUSE, spec.pause_per_h, spec.pause_s, 1.0),
    )
    out = []
    for node in nodes:
        for kind, per_h, mean_s, factor in kinds:
            if per_h <= 0 or (kind in (FaultKind.SLOW, FaultKind.PAUSE) and node not in learners):
                continue
            t = float(rng.exponential(3600.0 / per_h))
            while t < horizon_s:
                duration = float(rng.exponential(mean_s))
                out.append(Fault(kind=kind, node=node, at_s=t, duration_s=duration, factor=factor))
                t += duration + float(rng.exponential(3600.0 / per_h))
    return tuple(out)


@attrs.frozen(kw_only=True)
class Intervals:
    """Sorted, merged ``[start, end)`` intervals with a factor (inf: paused)."""

    starts: tuple[float, ...] = ()
    ends: tuple[float, ...] = ()
    factors: tuple[float, ...] = ()

    def at(self, t: float) -> tuple[float, float]:
        """The factor in force at ``t`` and the moment it next changes (inf: never)."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and t < self.ends[i]:
            return self.factors[i], self.ends[i]
        following = self.starts[i + 1] if i + 1 < len(self.starts) else math.inf
        return 1.0, following


SLOWDOWNS = (FaultKind.PAUSE, FaultKind.SLOW)


def intervals_of(
    faults: tuple[Fault, ...], node: str, kinds: tuple[FaultKind, ...] = SLOWDOWNS
) -> Intervals:
    """``node``'s intervals of these kinds, cut where any begins or ends.

    In each piece the largest factor of the intervals covering it holds: a pause or
    a cut-off (factor infinity) beats a slowdown, and a slower slowdown a faster one.
    """
    edges: list[tuple[float, int, float]] = []
    for f in faults:
        if f.node == node and f.kind in kinds and f.duration_s > 0:
            factor = f.factor if f.kind is FaultKind.SLOW else math.inf
            edges.extend(((f.at_s, 1, factor), (f.at_s + f.duration_s, -1, factor)))
    edges.sort()
    active: dict[float, int] = {}
    starts: list[float] = []
    ends: list[float] = []
    factors: list[float] = []
    for i, (t, sign, factor) in enumerate(edges):
        active[factor] = active.get(factor, 0) + sign
        if active[factor] == 0:
            del active[factor]
        following = edges[i + 1][0] if i + 1 < len(edges) else t
        if active and following > t:
            starts.append(t)
            ends.append(following)
            factors.append(max(active))
    return Intervals(starts=tuple(starts), ends=tuple(ends), factors=tuple(factors))


def plan_steps(
    start_s: float,
    steps: int,
    mean_s: float,
    jitter: float,
    slowdowns: Intervals,
    rng: np.random.Generator,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """End times and compute seconds of the next ``steps`` steps from ``start_s``.

    A step needs its nominal time of work; work stops during a pause and runs
    ``factor`` times slower during a slowdown, so a pause that begins mid-step
    delays that step by the pause's length.
    """
    noise = rng.uniform(-jitter, jitter, steps) if jitter > 0 else np.zeros(steps)
    ends = np.empty(steps)
    work = np.empty(steps)
    t = start_s
    for i in range(steps):
        t, work[i] = _finish_step(t, mean_s * (1.0 + float(noise[i])), slowdowns)
        ends[i] = t
    return ends, work


def _finish_step(t: float, nominal_s: float, slowdowns: Intervals) -> tuple[float, float]:
    """When a step of ``nominal_s`` begun at ``t`` ends, and the seconds it computed."""
    left, busy = nominal_s, 0.0
    while left > 0:
        factor, until = slowdowns.at(t)
        if factor == math.inf:
            t = until
            continue
        needed = left * factor
        if t + needed <= until:
            return t + needed, busy + needed
        left -= (until - t) / factor
        busy += until - t
        t = until
    return t, busy
