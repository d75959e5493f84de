"""Property tests for gm_core.verdicts: snapshot judgement, merge weights, closing."""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gm_core import verdicts
from gm_core.records import PayloadRef, Reason, Snapshot
from gm_core.verdicts import judge_snapshot, merge_weight, normalized_weights, ready_to_close

DIGEST = "ab" * 32
OTHER_DIGEST = "cd" * 32
REF = PayloadRef(key="k", size=1, digest="00")

# Fault → the reason it must produce, in the documented order of checks.
FAULTS = [
    "round",
    "fragment",
    "negative",
    "future_base",
    "schema",
    "zero_steps",
    "stale",
    "unsigned",
]
REASON = {
    "round": Reason.CORRUPT,
    "fragment": Reason.CORRUPT,
    "negative": Reason.CORRUPT,
    "future_base": Reason.CORRUPT,
    "schema": Reason.SCHEMA,
    "zero_steps": Reason.ZERO_STEPS,
    "stale": Reason.STALE,
    "unsigned": Reason.UNSIGNED,
}


class View(NamedTuple):
    """What the closer knows when it judges (its schema digest is always DIGEST)."""

    round: int
    fragment: int
    committed_version: int
    require_signatures: bool
    max_stale_versions: int


@st.composite
def situations(draw: st.DrawFn) -> tuple[Snapshot, View, frozenset[str]]:
    """A snapshot, the closer's view, and the set of faults deliberately injected."""
    faults = frozenset(draw(st.sets(st.sampled_from(FAULTS))))
    round_ = draw(st.integers(0, 10**6))
    fragment = draw(st.integers(0, 64))
    committed = draw(st.integers(0, 1000))
    max_stale = draw(st.integers(0, 5))
    lag = draw(st.integers(0, min(max_stale, committed)))
    base = committed - lag
    if "stale" in faults:
        assume(committed > max_stale)
        base = draw(st.integers(0, committed - max_stale - 1))
    if "future_base" in faults:
        base = committed + draw(st.integers(1, 100))
    steps = draw(st.integers(1, 10**6))
    tokens = draw(st.integers(0, 10**9))
    if "zero_steps" in faults:
        steps = 0
    if "negative" in faults:
        which = draw(st.sampled_from(["steps", "tokens", "base"]))
        if which == "steps":
            steps = draw(st.integers(max_value=-1))
        elif which == "tokens":
            tokens = draw(st.integers(max_value=-1))
        else:
            base = draw(st.integers(max_value=-1))
            faults = faults - {"stale", "future_base"}
    snapshot = Snapshot(
        learner=draw(st.text(min_size=1, max_size=8)),
        round=round_ + (draw(st.integers(1, 10)) if "round" in faults else 0),
        fragment=fragment + (draw(st.integers(1, 10)) if "fragment" in faults else 0),
        base_version=base,
        steps=steps,
        tokens=tokens,
        step_s=0.1,
        schema_digest=OTHER_DIGEST if "schema" in faults else DIGEST,
        payload=REF,
        signature="" if "unsigned" in faults else draw(st.sampled_from(["", "sig"])),
    )
    view = View(
        round=round_,
        fragment=fragment,
        committed_version=committed,
        require_signatures="unsigned" in faults or draw(st.booleans()),
        max_stale_versions=max_stale,
    )
    if "unsigned" not in faults and view.require_signatures:
        snapshot = attrs.evolve(snapshot, signature="sig")
    return snapshot, view, faults


@given(situations())
def test_first_failing_check_wins(situation: tuple[Snapshot, View, frozenset[str]]) -> None:
    snapshot, view, faults = situation
    verdict = judge_snapshot(snapshot, schema_digest=DIGEST, **view._asdict())
    if not faults:
        assert verdict is None
    else:
        first = min(faults, key=FAULTS.index)
        assert verdict is REASON[first]


@given(
    st.builds(
        Snapshot,
        learner=st.text(max_size=4),
        round=st.integers(),
        fragment=st.integers(),
        base_version=st.integers(),
        steps=st.integers(),
        tokens=st.integers(),
        step_s=st.floats(),
        schema_digest=st.text(max_size=4),
        payload=st.just(REF),
        final=st.booleans(),
        signature=st.text(max_size=4),
    ),
    st.integers(0, 100),
    st.integers(0, 100),
    st.integers(0, 100),
    st.booleans(),
    st.integers(0, 5),
)
def test_any_peer_record_gets_a_verdict_without_raising(
    snapshot: Snapshot, round_: int, fragment: int, committed: int, signed: bool, stale: int
) -> None:
    verdict = judge_snapshot(
        snapshot,
        round=round_,
        fragment=fragment,
        committed_version=committed,
        schema_digest=DIGEST,
        require_signatures=signed,
        max_stale_versions=stale,
    )
    assert verdict is None or isinstance(verdict, Reason)
    if verdict is None:  # accepted means every documented condition holds
        assert snapshot.round == round_
        assert snapshot.fragment == fragment
        assert 0 <= committed - snapshot.base_version <= stale
        assert snapshot.steps >= 1
        assert snapshot.tokens >= 0
        assert snapshot.schema_digest == DIGEST
        assert snapshot.signature or not signed


@given(st.integers(max_value=-1))
def test_judge_misuse_raises(bad: int) -> None:
    snapshot = Snapshot(
        learner="a",
        round=0,
        fragment=0,
        base_version=0,
        steps=1,
        tokens=1,
        step_s=0.1,
        schema_digest=DIGEST,
        payload=REF,
    )
    for r, f, c in [(bad, 0, 0), (0, bad, 0), (0, 0, bad)]:
        with pytest.raises(ValueError, match="must be >= 0"):
            judge_snapshot(
                snapshot,
                round=r,
                fragment=f,
                committed_version=c,
                schema_digest=DIGEST,
                require_signatures=False,
            )
    with pytest.raises(ValueError, match="max_stale"):
        judge_snapshot(
            snapshot,
            round=0,
            fragment=0,
            committed_version=0,
            schema_digest=DIGEST,
            require_signatures=False,
            max_stale_versions=bad,
        )


# -- weights ---------------------------------------------------------------------------


@given(st.integers(0, 10**12), st.integers(1, 10**9))
def test_merge_weight_is_tokens_squared_over_steps(tokens: int, steps: int) -> None:
    weight = merge_weight(tokens, steps)
    assert math.isclose(weight, tokens**2 / steps, rel_tol=1e-12)
    assert weight >= 0
    assert merge_weight(tokens + 1, steps) > weight
    assert merge_weight(tokens, steps + 1) <= weight


@given(st.integers(), st.integers())
def test_merge_weight_rejects_impossible_counts(tokens: int, steps: int) -> None:
    assume(steps < 1 or tokens < 0)
    with pytest.raises(ValueError, match="steps" if steps < 1 else "tokens"):
        merge_weight(tokens, steps)


WEIGHTS = st.lists(st.floats(0, 1e300, allow_subnormal=True), max_size=20)


@given(WEIGHTS)
def test_normalized_weights_sum_to_one_and_keep_ratios(weights: list[float]) -> None:
    normalized = normalized_weights(weights)
    assert len(normalized) == len(weights)
    if not weights:
        return
    assert math.isclose(math.fsum(normalized), 1.0, rel_tol=1e-9)
    assert all(w >= 0 for w in normalized)
    if max(weights) == 0:
        assert normalized == tuple(1 / len(weights) for _ in weights)
        return
    i = weights.index(max(weights))
    for w, n in zip(weights, normalized, strict=True):
        # Each share keeps its ratio to the largest one.
        assert math.isclose(n / normalized[i], w / weights[i], rel_tol=1e-9, abs_tol=1e-300)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=10), st.floats(1e-6, 1e6))
def test_normalized_weights_are_scale_free(weights: list[float], scale: float) -> None:
    assume(max(weights) > 0)
    a = normalized_weights(weights)
    b = normalized_weights([w * scale for w in weights])
    assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a, b, strict=True))


@given(WEIGHTS, st.sampled_from([-1.0, -1e-300, math.nan, math.inf]))
def test_normalized_weights_reject_bad_values(weights: list[float], bad: float) -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        normalized_weights([*weights, bad])


# -- ready_to_close --------------------------------------------------------------------

NODES = st.frozensets(st.sampled_from("abcdefgh"))


@given(st.integers(0, 10), NODES, NODES, st.integers(1, 10), NODES)
def test_ready_to_close_rule(
    accepted: int,
    reported: frozenset[str],
    live: frozenset[str],
    quorum: int,
    lapsed: frozenset[str],
) -> None:
    ready = ready_to_close(
        accepted=accepted, reported=reported, live=live, quorum=quorum, lapsed=lapsed
    )
    if accepted >= quorum:
        assert ready
    elif not live and not lapsed:
        assert not ready  # nobody to wait for, nothing merged: stay open
    else:
        # A learner that lapsed while the round waited is waited for no longer: if it
        # was the only one, the round closes (empty), so that it sees a record again.
        assert ready == (live <= reported)


@given(st.integers(0, 10), NODES, NODES, st.integers(1, 10), st.sampled_from("abcdefgh"))
def test_ready_to_close_is_monotone(
    accepted: int, reported: frozenset[str], live: frozenset[str], quorum: int, extra: str
) -> None:
    # More acceptances or more reports never reopen a round that was ready.
    if ready_to_close(accepted=accepted, reported=reported, live=live, quorum=quorum):
        assert ready_to_close(accepted=accepted + 1, reported=reported, live=live, quorum=quorum)
        assert ready_to_close(
            accepted=accepted, reported=reported | {extra}, live=live, quorum=quorum
        )


@given(NODES.filter(bool), st.integers(1, 10))
def test_everyone_rejected_still_closes(live: frozenset[str], quorum: int) -> None:
    assert ready_to_close(accepted=0, reported=live, live=live, quorum=quorum)


@given(st.integers(max_value=0), st.integers(max_value=-1))
def test_ready_to_close_misuse_raises(quorum: int, accepted: int) -> None:
    with pytest.raises(ValueError, match="quorum"):
        ready_to_close(accepted=0, reported=frozenset(), live=frozenset(), quorum=quorum)
    with pytest.raises(ValueError, match="accepted"):
        ready_to_close(accepted=accepted, reported=frozenset(), live=frozenset(), quorum=1)


raw_weights = st.lists(st.floats(min_value=0.0, max_value=1e300), min_size=1, max_size=12)
factors = st.one_of(st.none(), st.floats(min_value=1.0, max_value=20.0))


@given(raw=raw_weights, factor=factors)
def test_capped_shares_sum_to_one_and_none_exceeds_the_cap(
    raw: list[float], factor: float | None
) -> None:
    plain = verdicts.normalized_weights(raw)
    shares = verdicts.capped_shares(plain, factor)
    assert math.isclose(math.fsum(shares), 1.0, rel_tol=1e-9)
    n = len(shares)
    if factor is None or factor >= n:
        assert shares == plain
        return
    cap = factor / n
    assert all(s <= cap * (1 + 1e-9) for s in shares)
    for p, s in zip(plain, shares, strict=True):
        if p <= cap:  # never capped: it only gains what the capped ones gave up
            assert s >= p * (1 - 1e-9)
    for i in range(n):  # the order of the plain shares is kept
        for j in range(n):
            if plain[i] >= plain[j]:
                assert shares[i] >= shares[j] * (1 - 1e-9) or math.isclose(shares[i], cap)


@given(honest=st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=3, max_size=9))
def test_one_learner_claiming_absurd_counts_takes_at_most_the_cap(honest: list[float]) -> None:
    liar = verdicts.merge_weight(2**62, 1)
    shares = verdicts.capped_shares(verdicts.normalized_weights([*honest, liar]), 2.0)
    assert shares[-1] <= 2.0 / (len(honest) + 1) * (1 + 1e-9)
