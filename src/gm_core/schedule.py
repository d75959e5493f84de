"""The round schedule: which fragment each round syncs, and at which local step.

Theory of operation
-------------------
Streaming DiLoCo spreads the synchronization of ``P`` fragments evenly over the
``H`` local steps of one outer cycle. Round ``r`` syncs fragment ``r mod P`` and is
due when a learner's local step count reaches

    step_of(r) = (r div P)·H + floor(((r mod P) + 1)·H / P)  =  floor((r + 1)·H / P),

so round ``r + P`` is always exactly ``H`` steps after round ``r``: every fragment
is synced once per ``H`` steps. When ``H >= P`` every round has its own step; when
``H < P`` several rounds fall on the same step (and some on step 0), and a learner
publishes all of them together. Everything here is integer arithmetic in O(1), so
every node computes the same schedule without coordination.
"""

from __future__ import annotations


def _check_config(sync_every: int, fragments: int) -> None:
    # A caller's misuse, not peer data: raise rather than guess.
    if sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    if fragments < 1:
        raise ValueError(f"fragments must be >= 1, got {fragments}")


def _check_round(round: int) -> None:
    if round < 0:
        raise ValueError(f"round must be >= 0, got {round}")


def _check_step(step: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


def fragment_of(round: int, fragments: int) -> int:
    """The fragment round ``round`` synchronizes: fragments take turns in index order."""
    _check_round(round)
    if fragments < 1:
        raise ValueError(f"fragments must be >= 1, got {fragments}")
    return round % fragments


def step_of(round: int, sync_every: int, fragments: int) -> int:
    """The local step at which round ``round`` is due.

    Written as the brief's cycle-plus-offset form (not the equivalent
    ``floor((r+1)·H/P)``) so the code reads like the protocol text.
    """
    _check_config(sync_every, fragments)
    _check_round(round)
    cycle, offset = divmod(round, fragments)
    return cycle * sync_every + ((offset + 1) * sync_every) // fragments


def gap_of(round: int, sync_every: int, fragments: int) -> int:
    """Steps between round ``round - 1`` and round ``round`` (round 0: since step 0).

    The gap is what a learner trains between two publications; it is
    ``floor(H/P)`` or ``ceil(H/P)``, and may be 0 when ``H < P``.
    """
    _check_config(sync_every, fragments)
    _check_round(round)
    previous = 0 if round == 0 else step_of(round - 1, sync_every, fragments)
    return step_of(round, sync_every, fragments) - previous


def _first_round_after(step: int, sync_every: int, fragments: int) -> int:
    # Valid for step >= -1 (step -1 gives round 0), so rounds_due can use it for step 0.
    if step < 0:
        return 0
    # Rounds of earlier cycles are all due at or before cycle·H <= step; inside the
    # cycle, round cycle·P + k is due at cycle·H + floor((k+1)·H/P), which exceeds
    # step = cycle·H + s exactly when (k+1)·H >= (s+1)·P. Take the smallest such k.
    cycle, within = divmod(step, sync_every)
    k = -(-((within + 1) * fragments) // sync_every) - 1  # ceil((s+1)·P/H) - 1
    return cycle * fragments + k


def first_round_after(step: int, sync_every: int, fragments: int) -> int:
    """The smallest round ``r`` with ``step_of(r) > step``: the next round ahead of a learner.

    Computed in O(1) so that a learner joining at step 10⁹ does not walk the schedule.
    """
    _check_config(sync_every, fragments)
    _check_step(step)
    return _first_round_after(step, sync_every, fragments)


def rounds_due(step: int, sync_every: int, fragments: int) -> tuple[int, ...]:
    """Every round due exactly at local step ``step``, in increasing order.

    Usually zero or one round; several when ``H < P``, because then consecutive
    rounds share a step and a learner must publish all of them when it gets there.
    """
    _check_config(sync_every, fragments)
    _check_step(step)
    first = _first_round_after(step - 1, sync_every, fragments)
    stop = _first_round_after(step, sync_every, fragments)
    return tuple(range(first, stop))


def rounds_between(after_step: int, through_step: int, sync_every: int, fragments: int) -> range:
    """Rounds due in the step interval ``(after_step, through_step]``, in order.

    For a learner that advances several steps at once (or catches up after a
    pause): every round it crossed, each exactly once. ``after_step`` may be -1 to
    include the rounds due at step 0.
    """
    _check_config(sync_every, fragments)
    if after_step < -1:
        raise ValueError(f"after_step must be >= -1, got {after_step}")
    if through_step < after_step:
        raise ValueError(f"through_step {through_step} is before after_step {after_step}")
    return range(
        _first_round_after(after_step, sync_every, fragments),
        _first_round_after(through_step, sync_every, fragments),
    )
