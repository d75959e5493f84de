"""What a simulation measures, and the summary it reports.

Theory of operation
-------------------
The world keeps raw tallies while it runs (:class:`Tally`: compute seconds and
steps per learner, membership and uptime, request counts per class, commit times,
committed-model losses); :func:`summarize` turns them and the tape into a
:class:`Summary` once the run ends.

Goodput is the share of the learners' capacity (learner-seconds of membership,
crashed or not) that ends up in a commit. Every optimizer step moves every
fragment; a committed delta of fragment ``f`` carries some of its learner's steps
of ``f``, and the :class:`Ledger` credits each (learner, fragment, step) once, the
first time a commit carries it, at the learner's nominal step time divided by
``P``. Steps that were rolled back, overwritten by an alignment, rejected,
trained while cut off, or never trained because the learner was down, paused or
stalled are not in it. Staleness is how many versions of its fragment
a participant's base was behind when the record committed.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping

import attrs

from gm_core.records import RoundRecord
from gm_core.sim.scenario import RequestClass
from gm_core.sim.store import cost_usd


@attrs.frozen(kw_only=True)
class Sample:
    """The run at one moment: compute committed so far and capacity so far."""

    time_s: float
    committed_s: float
    capacity_s: float
    records: int

    @property
    def goodput(self) -> float:
        return self.committed_s / self.capacity_s if self.capacity_s > 0 else 0.0


@attrs.define(kw_only=True)
class Tally:
    """Raw counts the world accumulates; mutable while the run lasts."""

    step_s: dict[str, float]
    compute_s: dict[str, float] = attrs.field(factory=dict)
    steps: dict[str, int] = attrs.field(factory=dict)
    joined_s: dict[str, float] = attrs.field(factory=dict)
    left_s: dict[str, float] = attrs.field(factory=dict)
    down_s: dict[str, float] = attrs.field(factory=dict)
    down_since: dict[str, float] = attrs.field(factory=dict)
    requests: dict[RequestClass, int] = attrs.field(factory=dict)
    failed: dict[RequestClass, int] = attrs.field(factory=dict)
    commits: dict[int, float] = attrs.field(factory=dict)
    losses: list[tuple[float, int, float]] = attrs.field(factory=list)
    samples: list[Sample] = attrs.field(factory=list)

    def count(self, classes: tuple[RequestClass, ...], failed: bool) -> None:
        for cls in classes:
            self.requests[cls] = self.requests.get(cls, 0) + 1
            if failed:
                self.failed[cls] = self.failed.get(cls, 0) + 1

    step_ends: dict[tuple[str, int], list[float]] = attrs.field(factory=dict)

    def trained(self, name: str, seconds: float, ends: list[float], incarnation: int) -> None:
        """``len(ends)`` more steps of one incarnation, ending at these times."""
        self.steps[name] = self.steps.get(name, 0) + len(ends)
        self.compute_s[name] = self.compute_s.get(name, 0.0) + seconds
        self.step_ends.setdefault((name, incarnation), []).extend(ends)

    def capacity_s(self, now_s: float) -> float:
        """Learner-seconds of membership up to ``now_s`` (joined and not yet left)."""
        return sum(
            max(0.0, min(self.left_s.get(n, now_s), now_s) - t) for n, t in self.joined_s.items()
        )

    def uptime_s(self, now_s: float) -> float:
        open_down = sum(now_s - t for t in self.down_since.values())
        return self.capacity_s(now_s) - sum(self.down_s.values()) - open_down


@attrs.frozen(kw_only=True)
class Summary:
    duration_s: float
    records: int
    goodput: float
    train_share: float
    uptime: float
    rounds_per_h: float
    participants_mean: float
    participants_min: int
    participants_max: int
    empty_rounds: int
    staleness_mean: float
    staleness_max: int
    rejections: Mapping[str, int]
    closers: Mapping[str, int]
    takeovers: int
    requests: Mapping[str, int]
    failed_requests: Mapping[str, int]
    cost_usd: float
    steps: int
    final_loss: float | None
    losses: tuple[tuple[float, int, float], ...]
    samples: tuple[Sample, ...]
    trained_share: float
    """Share of the learners' capacity spent on steps that were not rolled back, in the
    middle of the run, at nominal step cost — what a failure model without a protocol
    calls goodput; :attr:`settled_goodput` further charges what the protocol dropped."""
    settled_goodput: float
    """Goodput of the steps trained in the middle of the run — after the first tenth,
    before the last tenth — counting every one of them that any commit carried,
    whenever it landed. The whole-run :attr:`goodput` counts the last rounds' work,
    not yet committed when the run stops, as lost; this figure has no such edge."""

    def steady_goodput(self, warmup_s: float) -> float:
        """Goodput of the steps trained after ``warmup_s`` and at least two rounds before
        the end (see :attr:`settled_goodput`); kept for callers that pick a warm-up."""
        return self.settled_goodput if warmup_s >= 0 else self.goodput


@attrs.frozen(kw_only=True)
class Span:
    """The local steps ``(start, end]`` a captured delta holds, of one learner incarnation."""

    learner: str
    incarnation: int
    fragment: int
    start: int
    end: int


@attrs.define(kw_only=True)
class Ledger:
    """Which learner-steps have reached a commit, each counted once per fragment.

    A delta holds the steps since its learner's anchor; with ``in_flight`` above
    ``P`` a learner publishes before aligning its previous round of the fragment,
    so consecutive deltas overlap. The ledger credits each step of each fragment
    the first time a committed delta holds it.
    """

    spans: dict[str, Span] = attrs.field(factory=dict)
    high: dict[tuple[str, int, int], int] = attrs.field(factory=dict)
    credited: dict[tuple[str, int, int], list[tuple[int, int]]] = attrs.field(factory=dict)

    def credit(self, span: Span) -> int:
        """Steps of ``span`` not credited before; they are credited now."""
        key = (span.learner, span.incarnation, span.fragment)
        done = self.high.get(key, span.start)
        low = max(span.start, done)
        new = max(0, span.end - low)
        self.high[key] = max(done, span.end)
        if new:
            self.credited.setdefault(key, []).append((low, span.end))
        return new

    def credited_between(
        self, times: Mapping[tuple[str, int], list[float]], start_s: float, end_s: float
    ) -> dict[str, int]:
        """Per learner, credited steps (summed over fragments) trained in ``(start_s, end_s]``.

        ``times[(learner, incarnation)][i]`` is when that incarnation's step ``i+1`` ended.
        """
        out: dict[str, int] = {}
        for (learner, incarnation, _), ranges in sorted(self.credited.items()):
            ended = times.get((learner, incarnation), [])
            lo = bisect.bisect_right(ended, start_s)
            hi = bisect.bisect_right(ended, end_s)
            inside = sum(max(0, min(b, hi) - max(a, lo)) for a, b in ranges)
            out[learner] = out.get(learner, 0) + inside
        return out


def settled(tally: Tally, ledger: Ledger, fragments: int, now_s: float) -> tuple[float, float]:
    """Shares of the middle eight tenths of the run: steps committed, and steps trained.

    Both at each learner's nominal step cost over the learners' capacity in that
    window; the second counts every step trained, committed or not.
    """
    start_s, end_s = 0.1 * now_s, 0.9 * now_s
    capacity = tally.capacity_s(end_s) - tally.capacity_s(start_s)
    if capacity <= 0:
        return 0.0, 0.0
    steps = ledger.credited_between(tally.step_ends, start_s, end_s)
    useful = sum(n * tally.step_s.get(name, 0.0) for name, n in steps.items()) / fragments
    trained = 0.0
    for (name, _), ends in sorted(tally.step_ends.items()):
        inside = bisect.bisect_right(ends, end_s) - bisect.bisect_right(ends, start_s)
        trained += inside * tally.step_s.get(name, 0.0)
    return useful / capacity, trained / capacity


def summarize(
    tally: Tally,
    records: list[RoundRecord],
    committed_s: float,
    middle: tuple[float, float],
    now_s: float,
) -> Summary:
    capacity = max(tally.capacity_s(now_s), 1e-12)
    counts = [len(r.participants) for r in records]
    stale = [r.version - 1 - x.base_version for r in records for x in r.participants]
    rejections: dict[str, int] = {}
    closers: dict[str, int] = {}
    for r in records:
        closers[r.closer] = closers.get(r.closer, 0) + 1
        for x in r.rejections:
            rejections[x.reason.value] = rejections.get(x.reason.value, 0) + 1
    return Summary(
        duration_s=now_s,
        records=len(records),
        goodput=committed_s / capacity,
        train_share=sum(tally.compute_s.values()) / capacity,
        uptime=tally.uptime_s(now_s) / capacity,
        rounds_per_h=len(records) / max(now_s, 1e-12) * 3600.0,
        participants_mean=statistics.fmean(counts) if counts else 0.0,
        participants_min=min(counts, default=0),
        participants_max=max(counts, default=0),
        empty_rounds=sum(1 for n in counts if n == 0),
        staleness_mean=statistics.fmean(stale) if stale else 0.0,
        staleness_max=max(stale, default=0),
        rejections=dict(sorted(rejections.items())),
        closers=dict(sorted(closers.items())),
        takeovers=sum(1 for r in records if r.claim > 0),
        requests={c.value: n for c, n in sorted(tally.requests.items())},
        failed_requests={c.value: n for c, n in sorted(tally.failed.items())},
        cost_usd=cost_usd(tally.requests),
        steps=sum(tally.steps.values()),
        final_loss=tally.losses[-1][2] if tally.losses else None,
        losses=tuple(tally.losses),
        samples=tuple(tally.samples),
        settled_goodput=middle[0],
        trained_share=middle[1],
    )
