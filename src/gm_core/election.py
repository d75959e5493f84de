"""Who closes a round: the node the previous record named, unless a claim took it over.

Theory of operation
-------------------
Each committed record names the closer of the next round. If that node goes
silent, a follower takes the round over by writing a create-once claim
``claims/<round>/<attempt>`` with the next attempt number; the store lets only
one writer create each attempt, so each attempt has exactly one holder. The
rightful closer is the holder of the highest attempt, or the named node when no
claim exists. A deposed closer that still commits is harmless: the round record
is create-once too, so exactly one record wins and everyone, loser included,
adopts it. These functions only read the claims listed; the listing and the
writes are the shell's.
"""

from __future__ import annotations

from collections.abc import Mapping


def _valid_attempts(claims: Mapping[int, str]) -> list[int]:
    # Attempts start at 1 (0 means "named by the record"); anything lower in the
    # store is junk from a faulty peer and cannot outrank a real claim.
    return [attempt for attempt in claims if attempt >= 1]


def rightful_closer(named: str, claims: Mapping[int, str]) -> tuple[str, int]:
    """``(closer, attempt)``: the highest claim's holder, or ``(named, 0)`` without claims."""
    attempts = _valid_attempts(claims)
    if not attempts:
        return named, 0
    highest = max(attempts)
    return claims[highest], highest


def next_attempt(claims: Mapping[int, str]) -> int:
    """The attempt number a new claim must use: one past the highest seen (1 when none).

    A claim for a lower number would be outranked at once; the create-once write
    of this number decides between followers that race for it.
    """
    return max(_valid_attempts(claims), default=0) + 1


def should_take_over(
    *,
    me: str,
    closer: str,
    closer_lease_live: bool,
    now_s: float,
    waiting_since_s: float,
    timeout_s: float,
) -> bool:
    """Whether ``me`` should claim the round from ``closer``.

    Never when ``me`` is the closer. Otherwise when the closer's lease has gone
    stale (it is gone), or when no record has appeared for ``timeout_s`` since the
    follower began waiting, on its own clock (the closer renews its lease but is
    stuck).
    """
    if timeout_s < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    if me == closer:
        return False
    return not closer_lease_live or now_s - waiting_since_s >= timeout_s
