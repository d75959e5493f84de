"""Property tests for gm_core.election: rightful closers, claim numbers, takeovers, preference."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core import auth, keys
from gm_core.election import (
    JUMP_AFTER,
    PREFER_WINDOW_TIMEOUTS,
    attempt_limit,
    claim_key,
    next_attempt,
    next_closer,
    rightful_closer,
    should_take_over,
)
from gm_core.records import FORMAT_2, FORMAT_VERSION

NODE = st.sampled_from(["a", "b", "c", "d"])
CLAIMS = st.dictionaries(st.integers(-3, 50), NODE, max_size=10)
HOLDER = st.sampled_from(["a", "b", "c", "d", ""])
"""A claim's holder as a follower read it; ``""``: the object there is no claim."""
ANY_CLAIMS = st.dictionaries(st.integers(-3, 80), HOLDER, max_size=40)
NONCE = st.binary(min_size=0, max_size=16)
TIME = st.integers(0, 10**6).map(float)
TIMEOUT = st.integers(0, 1000).map(float)


@given(NODE, ANY_CLAIMS)
def test_rightful_closer_is_named_or_a_claim_holder(named: str, claims: dict[int, str]) -> None:
    """The holder of the highest valid claim; an object that is no claim outranks nothing
    (spec/protocol.md §16.4.4): forging one above a live holder changes nobody's view."""
    closer, attempt = rightful_closer(named, claims)
    real = {a: n for a, n in claims.items() if a >= 1 and n}
    if not real:
        assert (closer, attempt) == (named, 0)
    else:
        assert attempt == max(real)
        assert closer == claims[attempt]
    forged = {**claims, max(claims, default=0) + 1: ""}
    assert rightful_closer(named, forged) == (closer, attempt)


@given(NODE, CLAIMS, st.data())
def test_exactly_one_rightful_closer_whatever_the_listing_order(
    named: str, claims: dict[int, str], data: st.DataObject
) -> None:
    items = list(claims.items())
    orders = [items, items[::-1], data.draw(st.permutations(items))]
    answers = {rightful_closer(named, dict(order)) for order in orders}
    assert len(answers) == 1


@given(ANY_CLAIMS, NONCE, st.integers(0, 99))
def test_next_attempt_outranks_every_valid_claim_and_meets_no_known_object(
    claims: dict[int, str], nonce: bytes, round_: int
) -> None:
    """Above the highest valid claim, at no attempt known to be taken; the lowest such until
    the follower met ``JUMP_AFTER`` objects this round, then within the next ``2^j`` past
    the highest of them."""
    attempt = next_attempt(claims, nonce=nonce, round_=round_, limit=2**32)
    assert attempt is not None
    top = max((a for a, n in claims.items() if a >= 1 and n), default=0)
    met = sorted(a for a in claims if a >= 1)
    assert attempt > top
    assert attempt not in claims
    if len(met) < JUMP_AFTER:
        assert all(a in claims for a in range(top + 1, attempt))
    else:
        j = len(met) - JUMP_AFTER + 1
        assert met[-1] < attempt <= met[-1] + 2**j
    if not any(a >= 1 for a in claims):
        assert attempt == 1


@given(NODE, st.lists(NODE, max_size=10))
def test_successive_claims_strictly_increase_and_each_wins(named: str, claimers: list[str]) -> None:
    claims: dict[int, str] = {}
    last = 0
    for node in claimers:
        attempt = next_attempt(claims)
        assert attempt == last + 1
        claims[attempt] = node  # the create-once write succeeds for one node
        assert rightful_closer(named, claims) == (node, attempt)
        last = attempt


def _bids_through(flood: range, nonce: bytes, limit: int = 2**32, holder: str = "") -> int | None:
    """How many bids a follower makes before it reaches an attempt ``flood`` left free, or
    None when none is left. ``holder``: what each flooded attempt holds as the follower reads
    it (``""``: no claim; a node id: a codec-valid claim naming a node never seen alive,
    which anyone can write in an open run)."""
    claims: dict[int, str] = {}
    for bids in range(1, 10_000):
        attempt = next_attempt(claims, nonce=nonce, round_=7, limit=limit)
        if attempt is None:
            return None
        if attempt not in flood:
            return bids
        claims[attempt] = holder
    raise AssertionError("never got through")


@given(st.integers(0, 200_000), st.binary(min_size=16, max_size=16), st.sampled_from(["", "ghost"]))
def test_a_flood_of_claims_delays_a_takeover_by_about_its_logarithm(
    flooded: int, nonce: bytes, holder: str
) -> None:
    """spec/protocol.md §16.4.4: an attacker who wrote the first ``N`` attempts of a round
    (anyone can in an open run) makes a follower with a nonce it cannot foresee bid about
    ``JUMP_AFTER + log2 N`` times, not ``N`` times; and in a format-2 run the ``2^32``
    attempts are never used up. The bound here is generous (the draws are a hash)."""
    bids = _bids_through(range(1, flooded + 1), nonce, holder=holder)
    assert bids is not None
    assert bids <= min(flooded, JUMP_AFTER) + 1 + 3 * (flooded.bit_length() + 2)


def test_format_1s_ten_thousand_attempts_can_be_filled_and_format_2s_cannot() -> None:
    """Why format 2 widens the attempts: the same flood of all 9,999 numbered attempts ends
    every takeover in a format-1 run (``claims_exhausted``) and costs a format-2 follower a
    couple dozen bids."""
    flood = range(1, keys.ATTEMPT_LIMIT)
    assert _bids_through(flood, b"n" * 16, limit=keys.ATTEMPT_LIMIT) is None
    bids = _bids_through(flood, b"n" * 16)
    assert bids is not None
    assert bids <= JUMP_AFTER + 3 * 16


@given(st.lists(st.binary(min_size=16, max_size=16), min_size=8, max_size=8, unique=True))
def test_where_followers_jump_depends_on_their_nonces(nonces: list[bytes]) -> None:
    """The draw is the nonce's: followers that met the same flood spread over the range (an
    attacker who could foresee one place would fill it)."""
    claims = dict.fromkeys(range(1, JUMP_AFTER + 20), "")
    places = {next_attempt(claims, nonce=n, round_=3, limit=2**32) for n in nonces}
    assert len(places) > 1


@given(NODE, st.booleans(), TIME, TIME, TIMEOUT)
def test_never_take_over_from_myself(
    me: str, live: bool, now: float, since: float, timeout: float
) -> None:
    assert not should_take_over(
        me=me,
        closer=me,
        closer_lease_live=live,
        now_s=now,
        waiting_since_s=since,
        timeout_s=timeout,
    )


@given(NODE, NODE, st.booleans(), TIME, TIME, TIMEOUT)
def test_take_over_rule(
    me: str, closer: str, live: bool, since: float, waited: float, timeout: float
) -> None:
    if me == closer:
        return
    now = since + waited
    decision = should_take_over(
        me=me,
        closer=closer,
        closer_lease_live=live,
        now_s=now,
        waiting_since_s=since,
        timeout_s=timeout,
    )
    assert decision == (not live or waited >= timeout)


@given(NODE, NODE, TIME, st.integers(0, 1000), st.integers(0, 1000), TIMEOUT)
def test_take_over_is_monotone_in_time(
    me: str, closer: str, since: float, w1: int, w2: int, timeout: float
) -> None:
    # Once a follower would take over, waiting longer never changes its mind.
    early, late = sorted((w1, w2))

    def decide(now: float) -> bool:
        return should_take_over(
            me=me,
            closer=closer,
            closer_lease_live=True,
            now_s=now,
            waiting_since_s=since,
            timeout_s=timeout,
        )

    if decide(since + early):
        assert decide(since + late)


def test_take_over_examples() -> None:
    def decide(live: bool, now: float) -> bool:
        return should_take_over(
            me="b",
            closer="a",
            closer_lease_live=live,
            now_s=now,
            waiting_since_s=100.0,
            timeout_s=30.0,
        )

    assert decide(live=False, now=100.0)  # closer gone: no need to wait
    assert not decide(live=True, now=129.0)
    assert decide(live=True, now=130.0)  # alive but silent for the whole timeout


@given(st.floats(max_value=-1e-9))
def test_negative_timeout_raises(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        should_take_over(
            me="a",
            closer="b",
            closer_lease_live=True,
            now_s=0.0,
            waiting_since_s=0.0,
            timeout_s=timeout,
        )


RENEWED = st.dictionaries(NODE, TIME, max_size=4)


@given(NODE, st.booleans(), RENEWED, TIME, TIMEOUT)
def test_the_next_closer_is_me_or_a_dedicated_closer_seen_renewing_lately(
    me: str, dedicated: bool, renewed: dict[str, float], now: float, timeout: float
) -> None:
    named = next_closer(me=me, dedicated=dedicated, renewed=renewed, now_s=now, timeout_s=timeout)
    live = sorted(
        n for n, at in renewed.items() if n != me and now - at <= PREFER_WINDOW_TIMEOUTS * timeout
    )
    if dedicated or not live:
        assert named == me
    else:
        assert named == live[0]  # the same closer for every committer that sees the same ones


@given(NODE, NODE, TIME, TIMEOUT, st.integers(0, 10**6))
def test_a_closer_not_seen_renewing_is_named_for_a_bounded_time_only(
    me: str, closer: str, seen: float, timeout: float, later: int
) -> None:
    # A crashed dedicated closer's lease stops changing: from PREFER_WINDOW_TIMEOUTS timeouts
    # after its last change on, no committer names it again, however often it commits.
    now = seen + PREFER_WINDOW_TIMEOUTS * timeout + 1 + later
    named = next_closer(
        me=me, dedicated=False, renewed={closer: seen}, now_s=now, timeout_s=timeout
    )
    assert named == me


def test_next_closer_examples() -> None:
    def named(me: str, dedicated: bool, renewed: dict[str, float], now: float) -> str:
        return next_closer(me=me, dedicated=dedicated, renewed=renewed, now_s=now, timeout_s=10.0)

    assert named("a", False, {}, 0.0) == "a"  # nobody to prefer: leadership stays put
    assert named("a", False, {"z": 95.0, "c": 99.0}, 100.0) == "c"  # the first in byte order
    assert named("a", False, {"c": 79.0}, 100.0) == "a"  # seen changing too long ago
    assert named("c", True, {"b": 99.0}, 100.0) == "c"  # a dedicated closer keeps the lead
    with pytest.raises(ValueError, match="timeout_s"):
        next_closer(me="a", dedicated=False, renewed={}, now_s=0.0, timeout_s=-1.0)


ROUND = st.integers(0, keys.ROUND_LIMIT - 1)
ATTEMPT = st.integers(1, keys.ATTEMPT_LIMIT - 1)
KEYED = auth.for_run("run", auth.derive(bytes(range(32))))
OTHER = auth.for_run("run", auth.derive(bytes(range(1, 33))))


@given(ROUND, ATTEMPT, ATTEMPT)
def test_claim_keys_are_numbered_in_open_runs_and_keyed_names_in_authenticated_ones(
    r: int, attempt: int, other: int
) -> None:
    """spec/protocol.md §16.4.4: an outsider cannot compute an authenticated run's claim key."""
    assert claim_key(auth.for_run("run", None), r, attempt) == keys.claim(r, attempt)
    assert claim_key(auth.for_run("run", None, FORMAT_VERSION), r, attempt) == keys.claim(
        r, attempt
    )
    public = claim_key(auth.for_run("run", None, FORMAT_2), r, attempt)  # format-2 open run
    parsed_public = keys.parse(public)
    assert isinstance(parsed_public, keys.ClaimKey)
    assert parsed_public.attempt is None
    named = claim_key(KEYED, r, attempt)
    assert public != named  # the public name key is not the run key's
    parsed = keys.parse(named)
    assert isinstance(parsed, keys.ClaimKey)
    assert (parsed.round, parsed.attempt) == (r, None)
    assert named.startswith(keys.claim_prefix(r))
    assert named != keys.claim(r, attempt)
    assert named != claim_key(OTHER, r, attempt)  # another key names other keys
    assert (named == claim_key(KEYED, r, other)) == (attempt == other)
    assert attempt_limit(auth.for_run("run", None, FORMAT_2)) == 2**32
    assert attempt_limit(KEYED) == keys.ATTEMPT_LIMIT  # a keyed run created before format 2
