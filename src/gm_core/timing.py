"""Timing estimates and the two waits they size: the grace window and the takeover timeout.

Theory of operation
-------------------
Every round record carries three exponential moving averages (EMAs): ξ_step, the
time of one local step; ξ_quorum, the time from a round's step to its quorum; and
ξ_sync, the time from asking for the merge to the record being drafted (merge and
payload writes; with no grace window, that is quorum to commit). The closer of each
round folds its own measurements in and writes the result into its record, so the
estimates travel with the tape and survive any change of closer.

The grace window lets stragglers join a round after quorum for as long as the
fastest learner would not be kept waiting for the commit: it can train ``ahead``
steps past the round's step before it needs it, which takes ``ahead·ξ_step``, of
which ``ξ_quorum + ξ_sync`` is already spent; γ takes a share of what is left. The
window never exceeds one gap of steps, and is zero until every estimate exists:
without measurements the safe wait is none.

Estimates are read from records written by other nodes; a value that is not a
number in ``[0, MAX_ESTIMATE_S]`` can only come from a faulty peer and is treated as
missing, so a corrupt record can shorten a wait to its floor but never stretch it
to infinity.

Outliers. Training loops stop for reasons the protocol does not see: an eval
pass, a checkpoint, ``torch.compile`` warming up, a garbage collection. A plain
EMA lets one such sample rule for many rounds (a 40 s pause in 0.07 s steps moved
ξ_step 30-fold and the grace windows with it). Samples are therefore *winsorized*
before they are folded in: a sample above ``OUTLIER_FACTOR·previous +
OUTLIER_SLACK_S`` counts as that bound. The stated properties, for decay ``d``
and factor ``c`` (0.1 and 2):

- bounded influence: one sample, however long, raises an estimate by at most a
  factor ``1 + d·(c − 1)`` = 1.1 (plus ``d·slack``); ``k`` outliers in a row by at
  most ``1.1^k``; lowering is never limited, so an estimate inflated by a
  warm-up falls back with every normal sample (by ``1 − d`` of the gap);
- recovery: after one outlier the estimate is within 10% of where it was, at the
  very next round, whatever the outlier's size;
- tracking: a lasting change is followed at up to 10% per sample upward (a 2×
  slowdown in 8 samples, 10× in 25) and at the EMA's rate downward.

A windowed median would also reject a burst of up to half its window, but it
needs a window of samples in every learner's state and in every round record; the
scalar rule keeps the records as they are. Known pauses need no estimate at all:
``Session.pause()`` keeps their time out of the step-time samples.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import attrs

from gm_core.records import AlgorithmConfig, Timing

EMA_DECAY = 0.1
"""Weight of each new sample: about ten rounds of memory."""

OUTLIER_FACTOR = 2.0
"""A sample above this many times the previous estimate counts as an outlier."""

OUTLIER_SLACK_S = 0.01
"""Added to the outlier bound, so an estimate near zero can still grow (10 ms: no wait
the protocol sizes from these estimates is sensitive below it)."""

MAX_ESTIMATE_S = 1e7
"""Largest believable duration (about 116 days). An estimate in a record that is
longer, negative or not a number is corrupt; a longer measurement is clamped to it.
Bounding estimates keeps every formula here finite."""


def ema(previous: float | None, sample: float, decay: float = EMA_DECAY) -> float:
    """Fold ``sample``, winsorized, into an EMA: ``(1 − decay)·previous + decay·sample``.

    A sample above :func:`outlier_bound` of ``previous`` counts as that bound (see
    the theory of operation). The first sample (``previous is None``, or a corrupt
    value from a peer) is taken as is, so an estimate exists after one measurement
    instead of creeping up from zero. Samples above ``MAX_ESTIMATE_S`` count as
    ``MAX_ESTIMATE_S``; negative or non-finite samples are the caller's bug and raise.
    """
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    if not (math.isfinite(sample) and sample >= 0.0):
        raise ValueError(f"sample must be finite and >= 0, got {sample}")
    # A measured duration beyond belief (a learner paused for months) is real, not
    # corrupt; clamp it so the estimate stays within what records may carry.
    sample = min(sample, MAX_ESTIMATE_S)
    if not _valid(previous):
        return sample
    assert previous is not None
    sample = min(sample, outlier_bound(previous))
    # This form (not previous + decay·(sample − previous)) gives exactly ``sample`` at
    # decay 1.
    blended = (1.0 - decay) * previous + decay * sample
    # Rounding may land an ulp outside [previous, sample]; an EMA never should.
    return min(max(blended, min(previous, sample)), max(previous, sample))


def step_sample(reports: Sequence[float]) -> float | None:
    """This round's ξ_step sample from the accepted snapshots' ``step_s`` (0: unmeasured).

    Each report is its learner's word, so the sample is the lower median of the
    measured ones: a minority of learners, whatever they report, cannot move it
    outside the range of the others' reports, and with two learners it is the
    faster one's (the step time the grace window is about). No sample while
    fewer than half the snapshots are measured: at a run's start the first
    snapshots carry no measurement, and one report must not set the estimate alone.
    """
    measured = [s for s in reports if s > 0.0]
    if not measured or 2 * len(measured) < len(reports):
        return None
    return statistics.median_low(measured)


def outlier_bound(previous: float) -> float:
    """The largest sample an estimate of ``previous`` takes at face value."""
    return min(OUTLIER_FACTOR * previous + OUTLIER_SLACK_S, MAX_ESTIMATE_S)


def update_timing(
    timing: Timing,
    *,
    step_s: float | None = None,
    quorum_s: float | None = None,
    sync_s: float | None = None,
) -> Timing:
    """Fold new measurements into ``timing``; an estimate whose sample is None is kept.

    Samples are the caller's own measurements (misuse raises); a corrupt previous
    estimate from a peer's record is replaced by the sample, as if missing.
    """
    return attrs.evolve(
        timing,
        step_s=timing.step_s if step_s is None else ema(timing.step_s, step_s),
        quorum_s=timing.quorum_s if quorum_s is None else ema(timing.quorum_s, quorum_s),
        sync_s=timing.sync_s if sync_s is None else ema(timing.sync_s, sync_s),
    )


def _valid(estimate: float | None) -> bool:
    return estimate is not None and 0.0 <= estimate <= MAX_ESTIMATE_S


def _estimates(timing: Timing) -> tuple[float, float, float] | None:
    """The three estimates, or None while any is missing or unusable."""
    step, quorum, sync = timing.step_s, timing.quorum_s, timing.sync_s
    if step is None or quorum is None or sync is None:
        return None
    if not (_valid(step) and _valid(quorum) and _valid(sync)):
        return None
    return step, quorum, sync


def grace_s(timing: Timing, *, ahead_steps: int, gap_steps: int, gamma: float) -> float:
    """``min(γ·max(ahead·ξ_step − (ξ_quorum + ξ_sync), 0), gap·ξ_step)``; 0 while unmeasured.

    Monotone in γ and in ``ahead_steps``, and never more than ``gap·ξ_step``: a
    grace longer than one gap would hold a round open past the next one's step.
    """
    if gamma < 0 or not math.isfinite(gamma):
        raise ValueError(f"gamma must be finite and >= 0, got {gamma}")
    if ahead_steps < 0 or gap_steps < 0:
        raise ValueError(f"ahead_steps and gap_steps must be >= 0, got {ahead_steps}, {gap_steps}")
    estimates = _estimates(timing)
    if estimates is None:
        return 0.0
    step, quorum, sync = estimates
    slack = max(ahead_steps * step - (quorum + sync), 0.0)
    grace = min(gamma * slack, gap_steps * step)
    # inf·0 (or inf − inf) is NaN; an absurd but finite estimate must not produce one.
    return grace if math.isfinite(grace) else 0.0


def window_s(timing: Timing, config: AlgorithmConfig, gap_steps: int) -> float:
    """The grace window of a round of ``gap_steps`` under ``config``, from the previous
    record's ``timing``: the run's fixed ``grace_seconds`` when it has one, else
    :func:`grace_s` with the run's ``ahead`` and γ."""
    if config.grace_seconds is not None:
        return config.grace_seconds
    return grace_s(
        timing,
        ahead_steps=ahead_steps(config, gap_steps),
        gap_steps=gap_steps,
        gamma=config.grace_gamma,
    )


def ahead_steps(config: AlgorithmConfig, gap_steps: int) -> int:
    """How many steps the fastest learner can train past a round's step without its commit.

    Without ``overlap_steps`` the bound is ``in_flight`` rounds of publishing, each
    about one gap apart: ``in_flight · gap_steps``. The round's own gap is used
    (rather than ``sync_every // fragments``) because it is what the closer has at
    hand, gaps of one schedule differ by at most one step, and when the gap is 0
    (``H < P``) the grace is capped at 0 anyway. With ``overlap_steps`` set, the
    learner also stops after that many steps on a fragment whose round is open,
    so the bound is the smaller of the two: whichever comes first blocks it.
    """
    if gap_steps < 0:
        raise ValueError(f"gap_steps must be >= 0, got {gap_steps}")
    if config.in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {config.in_flight}")
    by_rounds = config.in_flight * gap_steps
    if config.overlap_steps is None:
        return by_rounds
    if config.overlap_steps < 0:
        raise ValueError(f"overlap_steps must be >= 0, got {config.overlap_steps}")
    return min(config.overlap_steps, by_rounds)


def takeover_after_s(timing: Timing, config: AlgorithmConfig, gap_steps: int) -> float:
    """The takeover timeout of a round of ``gap_steps`` under ``config``: :func:`takeover_timeout_s`
    with the run's floor, plus the run's fixed ``grace_seconds`` when it has one.

    A leader that holds a round open for the fixed window after quorum is doing what the run
    asks, not stuck: the window is waited once on top of what a round takes. (The adaptive
    window is at most ``gap·ξ_step``, already within the factor.) Before (2026-12), a
    follower bid after the floor alone and took over each round a live leader held for its
    window, and then waited a window of its own.
    """
    base_s = takeover_timeout_s(timing, gap_steps=gap_steps, floor_s=config.takeover_floor_s)
    return base_s + (config.grace_seconds or 0.0)


def takeover_timeout_s(
    timing: Timing, *, gap_steps: int, floor_s: float, factor: float = 3.0
) -> float:
    """How long a follower waits for the next record before claiming the round itself.

    ``max(floor_s, factor·(gap·ξ_step + ξ_quorum + ξ_sync))``: a few times what a
    healthy round takes end to end, never below the configured floor, and exactly
    the floor until every estimate exists (a fresh run has no better idea).
    """
    if floor_s < 0 or not math.isfinite(floor_s):
        raise ValueError(f"floor_s must be finite and >= 0, got {floor_s}")
    if factor < 0 or not math.isfinite(factor):
        raise ValueError(f"factor must be finite and >= 0, got {factor}")
    if gap_steps < 0:
        raise ValueError(f"gap_steps must be >= 0, got {gap_steps}")
    estimates = _estimates(timing)
    if estimates is None:
        return floor_s
    step, quorum, sync = estimates
    timeout = factor * (gap_steps * step + quorum + sync)
    # An absurd (finite but huge) estimate would overflow to inf: then fall back
    # to the floor rather than never take over.
    return max(floor_s, timeout) if math.isfinite(timeout) else floor_s
