"""Garbage collection behind the commit: which rounds' prefixes may be deleted.

Theory of operation
-------------------
Round records are the tape and are never deleted; what piles up are the
snapshots, claims and payloads written for each round. Once round ``c`` commits,
nothing reads the snapshots or claims of a round that closed long ago, and the
payloads of a round stay needed only while the frontier still points at them. We
keep the last ``KEEP_CYCLES`` cycles (``KEEP_CYCLES·P`` rounds) untouched, which
holds the newest version of every fragment whenever each fragment committed in
that window, plus a margin for learners still fetching a slightly older commit.
A fragment whose recent rounds had no participants keeps an older version; the
round that wrote it is *pinned* (the newest frontier references its payloads) and
must survive.

The sweeper keeps one low-water mark, ``swept_below``: every round below it is
swept. The mark only advances over a contiguous run of swept rounds, so it stops
at the first pinned round and the rounds after that pin wait until the pin is
released (that fragment commits anew). This keeps the state one integer and
sweeps each round exactly once; the cost is that a pin that lasts holds back the
sweep behind it, which is rare (a fragment with no participants for two whole
cycles) and ends with that fragment's next commit.
"""

from __future__ import annotations

KEEP_CYCLES = 2
"""Cycles of rounds kept whole behind the newest commit."""


def _check(committed_round: int, fragments: int, swept_below: int, max_rounds: int | None) -> None:
    if committed_round < 0:
        raise ValueError(f"committed_round must be >= 0, got {committed_round}")
    if fragments < 1:
        raise ValueError(f"fragments must be >= 1, got {fragments}")
    if swept_below < 0:
        raise ValueError(f"swept_below must be >= 0, got {swept_below}")
    if max_rounds is not None and max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")


def _sweep_range(
    committed_round: int,
    fragments: int,
    swept_below: int,
    pinned: frozenset[int],
    max_rounds: int | None,
) -> range:
    _check(committed_round, fragments, swept_below, max_rounds)
    stop = committed_round - KEEP_CYCLES * fragments + 1  # exclusive
    blocking = [q for q in pinned if swept_below <= q < stop]
    if blocking:
        stop = min(blocking)
    if max_rounds is not None:
        stop = min(stop, swept_below + max_rounds)
    return range(swept_below, max(stop, swept_below))


def sweepable_rounds(
    *,
    committed_round: int,
    fragments: int,
    swept_below: int,
    pinned: frozenset[int],
    max_rounds: int | None = None,
) -> tuple[int, ...]:
    """Rounds whose snapshot, claim and payload prefixes may be deleted after ``committed_round``.

    These are the rounds ``q`` with ``swept_below ≤ q ≤ committed_round − KEEP_CYCLES·P``,
    in increasing order, up to but excluding the first round in ``pinned`` (so no
    pinned round, nor any after it, is ever returned), and at most ``max_rounds``
    of them when given, which bounds one sweep's work after a long pause.
    """
    return tuple(_sweep_range(committed_round, fragments, swept_below, pinned, max_rounds))


def new_swept_below(
    *,
    committed_round: int,
    fragments: int,
    swept_below: int,
    pinned: frozenset[int],
    max_rounds: int | None = None,
) -> int:
    """The low-water mark once :func:`sweepable_rounds` (same arguments) has been swept.

    It is the smallest round not yet swept: one past the last round returned, or
    ``swept_below`` unchanged when none was. It never passes a pinned round and
    never moves backwards.
    """
    return _sweep_range(committed_round, fragments, swept_below, pinned, max_rounds).stop
