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

import hashlib
from collections.abc import Mapping

from gm_core import keys
from gm_core.auth import Envelope, frames
from gm_core.records import CLAIM_LIMIT_2, FORMAT_2

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

JUMP_AFTER = 16
"""A bidder that has met this many invalid claims above the highest valid one it knows bids
at a random attempt from then on (:func:`next_attempt`, spec/protocol.md §16.4.4)."""

_JUMP_DOMAIN = b"gm claim jump"


def named_claims(envelope: Envelope) -> bool:
    """Whether this run's claims are named (the attempt in the body) rather than numbered in
    the key: every authenticated run's (keyed names), and every format-2 run's (an open
    one's under the public name key, spec §16.4.4). Only format-1 open runs number them."""
    return envelope.auth is not None or envelope.body_format == FORMAT_2


def attempt_limit(envelope: Envelope) -> int:
    """Claim attempts of this run are below this: ``2^32`` in a format-2 run (attempts live in
    bodies, so a random jump has room an attacker cannot fill), ``10^4`` in a format-1 run
    (numbered keys, and records a format-1 reader refuses above it)."""
    return CLAIM_LIMIT_2 if envelope.body_format == FORMAT_2 else keys.ATTEMPT_LIMIT


def claim_key(envelope: Envelope, round_: int, attempt: int) -> str:
    """The key of claim ``attempt`` for round ``round_`` (spec/protocol.md §16.4.4).

    A format-1 open run's claims are numbered in the key. Every other run's are named by a
    hash of the attempt: keyed in an authenticated run, which only holders of the run key
    can compute, so an outsider cannot occupy the attempt a follower will bid for next;
    under the public name key in a format-2 open run, where the name only makes room for
    ``2^32`` attempts (anyone can compute it: there the random jump of
    :func:`next_attempt` is what an attacker cannot foresee).
    """
    if not named_claims(envelope):
        return keys.claim(round_, attempt)
    name = envelope.slot_name(_CLAIM_KIND, f"{round_:012d}", attempt)
    return keys.named_claim(round_, name)


def _valid_attempts(claims: Mapping[int, str]) -> list[int]:
    # Attempts start at 1 (0 means "named by the record"); anything lower in the store is
    # junk from a faulty peer. A claim that names nobody ("") is no claim: it was forged,
    # garbage, or another format's, and outranks nothing (spec §16.4.4).
    return [attempt for attempt, holder in claims.items() if attempt >= 1 and holder]


def rightful_closer(named: str, claims: Mapping[int, str]) -> tuple[str, int]:
    """``(closer, attempt)``: the holder of the highest valid claim, or ``(named, 0)`` without
    one. ``claims`` maps attempts to their holders, ``""`` for an object that is no claim."""
    attempts = _valid_attempts(claims)
    if not attempts:
        return named, 0
    highest = max(attempts)
    return claims[highest], highest


def next_attempt(
    claims: Mapping[int, str],
    *,
    nonce: bytes = b"",
    round_: int = 0,
    limit: int = keys.ATTEMPT_LIMIT,
) -> int | None:
    """The attempt a new claim must use, or None when none is left below ``limit``.

    ``claims``: every attempt this follower met this round and its holder (``""``: no
    claim). At first, the lowest attempt above the highest valid claim that is not known to
    be taken: a lower one would be outranked at once, and the create-once write of this one
    decides between followers that race for it. Each object met costs a bidder a write and
    a read, and a claim that names a node never seen alive (anyone can write one in an open
    run) a lease look and a poll too; so after meeting :data:`JUMP_AFTER` objects in a round
    the bidder jumps past the highest attempt it knows to one drawn from the next ``2^j``
    (``j``: objects met beyond ``JUMP_AFTER - 1``) by a hash of its ``nonce`` (the shell's
    secret random bytes), the round and ``j``. An attacker who cannot foresee the draw must
    fill the whole range to be met again, so delaying a takeover by ``m`` more bids costs it
    about ``2^m`` objects, and a format-2 run's ``2^32`` attempts cannot be used up. Honest
    rounds meet a few claims (followers racing), never 16. Two bidders that jumped apart may
    both win a claim and lead; the record write decides, as always (spec §9.5).
    """
    top = max(_valid_attempts(claims), default=0)
    met = sorted(a for a in claims if a >= 1)
    if len(met) < JUMP_AFTER:
        attempt = top + 1
        while attempt in claims:
            attempt += 1
    else:
        j = min(len(met) - JUMP_AFTER + 1, 62)
        span = min(2**j, limit - met[-1] - 1)
        if span < 1:
            return None
        attempt = met[-1] + 1 + _draw(nonce, round_, j) % span
    return attempt if attempt < limit else None


def _draw(nonce: bytes, round_: int, j: int) -> int:
    """64 bits only the holder of ``nonce`` can foresee, for jump ``j`` in round ``round_``."""
    message = frames((_JUMP_DOMAIN, nonce, str(round_).encode(), str(j).encode()))
    return int.from_bytes(hashlib.sha256(message).digest()[:8], "big")


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
