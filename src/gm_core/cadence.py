"""When to look again for an object that is not there yet.

Theory of operation
-------------------
The objects a node waits for arrive in series at a roughly steady pace: the
next round record once per round, the first snapshot of each round once per
round. Asking for one every ``poll_s`` costs a request per poll interval per
node, almost all of them misses (a 30 s round polled each second is 29 misses
for one hit), and on S3 those misses were most of a run's bill.

A :class:`Cadence` remembers when the current wait began (the previous object's
sighting, or the start of the round) and an estimate of how long waits last: an
average of past waits that were *observed* — the object was found by a look that
came after at least one miss, so the wait spanned real time rather than a
catch-up read of objects already there. The next look is half the expected
remaining wait away, and never nearer than ``poll_s``: looks thin out while the
object cannot be due and tighten to ``poll_s`` as it nears and once it is late.
A round of ``T`` seconds then costs about ``log2(T / poll_s)`` looks plus the
ones around its arrival, instead of ``T / poll_s``.

Latency stays bounded in relative terms: an object that arrives ``x`` seconds
before it was expected is found at most ``x / 2`` seconds late (the looks before
the expected moment halve the distance each time), and one that arrives at or
after it is found within ``poll_s``. A wait that ended at the first look
overestimates itself, so an average that is too long shrinks by itself until
looks miss again. Whoever must not wait at all — a learner stalled on a commit,
a closer collecting the rest of a round once its first snapshot is in — polls
every ``poll_s`` and does not ask this module.
"""

from __future__ import annotations

import attrs

WEIGHT = 0.5
"""Weight of the newest observed wait in the average: waits drift with the run's pace."""


@attrs.frozen
class Cadence:
    """A poller's memory of one series of objects, on its own clock.

    ``since_s`` is when the current wait began (None: not yet); ``wait_s`` the
    average observed wait (None: none observed yet); ``missed`` whether a look
    in the current wait found nothing.
    """

    since_s: float | None = None
    wait_s: float | None = None
    missed: bool = False


def restart(cadence: Cadence, now_s: float) -> Cadence:
    """Begin a new wait at ``now_s`` without learning from the one before it."""
    return Cadence(since_s=now_s, wait_s=cadence.wait_s)


def missed(cadence: Cadence) -> Cadence:
    """A look found nothing: the wait now spans real time."""
    return attrs.evolve(cadence, missed=True)


def seen(cadence: Cadence, now_s: float) -> Cadence:
    """The awaited object was found at ``now_s``: learn the wait if observed, begin the next."""
    wait_s = cadence.wait_s
    if cadence.missed and cadence.since_s is not None:
        observed = max(now_s - cadence.since_s, 0.0)
        wait_s = observed if wait_s is None else WEIGHT * observed + (1 - WEIGHT) * wait_s
    return Cadence(since_s=now_s, wait_s=wait_s)


def next_look_s(
    cadence: Cadence, now_s: float, poll_s: float, *, longest_s: float = float("inf")
) -> float:
    """When to look next: half the expected remaining wait from now, at least ``poll_s``
    and at most ``longest_s``.

    The cap keeps one outlier wait (a pause, a stalled run) from spacing looks out
    for as long as it lasted: callers pass the lease timeout, the pace at which a
    run's nodes prove life anyway.
    """
    if poll_s < 0:
        raise ValueError(f"poll_s must be >= 0, got {poll_s}")
    if cadence.since_s is None or cadence.wait_s is None:
        return now_s + poll_s
    remaining_s = cadence.since_s + cadence.wait_s - now_s
    return now_s + max(poll_s, min(remaining_s / 2, longest_s))
