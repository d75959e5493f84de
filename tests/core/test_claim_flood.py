"""A claim flood in an open run (spec/protocol.md §16.4.4; issue 12 item 2).

In an open run anyone can write a claim: codec-valid ones naming nodes that never lived,
and garbage, at every attempt of a round. Format 1 numbered claims in four digits and
obeyed every object it met (an object that was no claim named "nobody" and outranked the
real ones), so a flood made each follower bid through it one attempt at a time, and
10^4 objects ended every takeover of the round (``claims_exhausted``). A format-2 run
names its claims (a public name in an open run), keeps the attempt in the body (below
2^32), skips objects that are no claim, and after meeting 16 objects in a round a follower
jumps to an attempt drawn by its own secret nonce: the model cluster here takes a crashed
closer's round over past a flood of 300 within a few dozen bids, where format 1's rule is
still bidding through it.
"""

from __future__ import annotations

import random

import pytest
from fast_cluster import FAST_C, FAST_L, C, L, drive

from gm_core import auth, codec, election
from gm_core import cluster as cl
from gm_core.records import FORMAT_2, AlgorithmConfig, Claim, RoundRecord

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1, in_flight=2)
FLOOD = 300
TICKS = 200
"""Ticks of 0.25 s after the closer's crash: enough for format 2's rule to take the round
over, not format 1's."""


def flooded(wire_format: int, seed: int, garbage_every: int = 0) -> tuple[cl.Cluster, str, int]:
    """A committing open run of ``wire_format`` whose next round's claims ``1..FLOOD`` hold
    codec-valid claims naming ghosts (every ``garbage_every``-th: garbage), at the keys a
    follower bids for; then the round's closer crashes. Returns the run, the crashed
    closer and the round."""
    options = {"learner_options": FAST_L, "closer_options": FAST_C}
    c = cl.create(CONFIG, ROLES, wire_format=wire_format, **options)  # type: ignore[arg-type]
    for name in sorted(ROLES):
        c = cl.start(c, name)
    rng = random.Random(seed)
    while not cl.records(c):
        c = drive(c, 1, rng)
    newest = cl.records(c)[-1]
    target = newest.round + 1
    envelope = auth.of_run(c.manifest, None)
    for attempt in range(1, FLOOD + 1):
        key = election.claim_key(envelope, target, attempt)
        body = codec.encode(Claim(round=target, attempt=attempt, node=f"ghost{attempt}"))
        if garbage_every and attempt % garbage_every == 0:
            body = b"\x00 not a claim"
        c = cl.inject(c, key, body)
    return cl.crash(c, newest.next_closer), newest.next_closer, target


def taken_over(c: cl.Cluster, target: int) -> RoundRecord | None:
    return next((r for r in cl.records(c) if r.round == target), None)


@pytest.mark.parametrize(("seed", "garbage_every"), [(1, 0), (2, 7), (3, 1)])
def test_a_format_2_open_run_takes_a_round_over_past_a_claim_flood(
    seed: int, garbage_every: int
) -> None:
    """The crashed closer's round is taken over above the flood (ghost claims, every seventh
    garbage, or all garbage), the run commits on, the invariants hold every tick
    (``drive``), and the winning claim is the run's own."""
    c, crashed, target = flooded(FORMAT_2, seed, garbage_every)
    rng, hung = random.Random(seed), frozenset({crashed})
    for _ in range(0, TICKS, 10):
        c = drive(c, 10, rng, hung=hung)
        if taken_over(c, target) is not None:
            break
    record = taken_over(c, target)
    assert record is not None, "the flooded round was never taken over"
    assert record.closer != crashed
    assert record.claim > election.JUMP_AFTER  # it met the flood and jumped past it
    assert not [n for _, n in c.notes if n.kind == "claims_exhausted"]
    for _ in range(0, 2 * TICKS, 10):  # and the run goes on
        c = drive(c, 10, rng, hung=hung)
        if cl.records(c)[-1].round >= target + 2:
            break
    assert cl.records(c)[-1].round >= target + 2


def test_format_1s_rule_bids_through_the_same_flood_one_attempt_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted contrast, same flood, seed and ticks: with format 1's rule (bid one past
    the highest attempt met, obey whatever is there, never jump) the follower is still
    bidding through the flood when the tick budget ends. Measured at seed 1: format 2's rule
    took the round over at tick 90 (22.5 s of model time, claim 672), format 1's at tick
    642 (160.5 s, claim 301: one bid, one lease look and one poll per ghost)."""
    monkeypatch.setattr(
        election,
        "next_attempt",
        lambda claims, **_: max((a for a in claims if a >= 1), default=0) + 1,
    )
    c, crashed, target = flooded(FORMAT_2, 1)
    c = drive(c, TICKS, random.Random(1), hung=frozenset({crashed}))
    assert taken_over(c, target) is None
