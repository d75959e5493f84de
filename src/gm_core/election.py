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

from gm_core import keys
from gm_core.auth import Envelope

DEDICATED = ("closer",)
"""The roles a dedicated closer's lease states."""
ELECTED = ("closer", "elected")
"""The roles the lease of an ``either`` node serving as closer states."""


def is_dedicated(roles: tuple[str, ...]) -> bool:
    """Whether a lease stating ``roles`` is a dedicated closer's (preferred as leader)."""
    return "closer" in roles and "learner" not in roles and "elected" not in roles


PREFER_WINDOW_TIMEOUTS = 2
"""A dedicated closer stays preferred this many lease timeouts after its lease was last seen
to change. The committer looks at the leases once per lease timeout and a live closer renews
at least twice per timeout, so a live one is seen changing at every look; the slack covers a
look that comes late. A crashed one is named for at most this long, and then never again."""


_CLAIM_KIND = "claim"


def claim_key(envelope: Envelope, round_: int, attempt: int) -> str:
    """The key of claim ``attempt`` for round ``round_`` (spec/protocol.md §16.4.4).

    An open run's claims are numbered in the key. An authenticated run's are named by a
    keyed hash of the attempt, which only holders of the run key can compute: an outsider
    cannot occupy the attempt a follower will bid for next, so no flood of claim objects
    can use the attempts up (format 1 halted takeovers after 10^4, spec §15.8).
    """
    if envelope.auth is None:
        return keys.claim(round_, attempt)
    name = envelope.slot_name(_CLAIM_KIND, f"{round_:012d}", attempt)
    return keys.named_claim(round_, name)


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


def next_closer(
    *, me: str, dedicated: bool, renewed: Mapping[str, float], now_s: float, timeout_s: float
) -> str:
    """Whom the record ``me`` commits names to lead the next round.

    ``me`` itself when it is a dedicated closer (leadership stays put between two of
    them) or when no other dedicated closer's lease was seen to change within
    ``PREFER_WINDOW_TIMEOUTS`` lease timeouts (``renewed``: node -> when, on this
    node's clock; the caller drops a closer it has since seen stale); otherwise the first
    such closer in byte order, so every committer that sees the same closers live names
    the same one.
    """
    if timeout_s < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    if dedicated:
        return me
    window_s = PREFER_WINDOW_TIMEOUTS * timeout_s
    live = sorted(n for n, at_s in renewed.items() if n != me and now_s - at_s <= window_s)
    return live[0] if live else me


def serves(*, me: str, others_live: int, dedicated_live: bool) -> bool:
    """Whether the ``either`` node ``me``, leading a round, stops training to serve as closer.

    Only while ``others_live`` (learners other than ``me`` live on its clock) is at least
    one, since serving alone would leave nobody training, and while no dedicated closer
    is live (``dedicated_live``: one of its leases live on ``me``'s clock, a lease first
    seen counting as live for a timeout), since that one will lead.
    """
    if not keys.valid_id(me):
        raise ValueError(f"invalid node id {me!r}")
    return others_live >= 1 and not dedicated_live
