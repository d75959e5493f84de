"""``global_batch_size`` shares (issue 13 item 7, gm_core.batch): exact, agreed, stable."""

from __future__ import annotations

import random

import attrs
from fast_cluster import FAST_C, FAST_L, C, L, drive
from hypothesis import given
from hypothesis import strategies as st

from gm_core import batch, codec
from gm_core import cluster as cl
from gm_core.records import AlgorithmConfig, RoundRecord

IDS = st.text("abcdef0123", min_size=1, max_size=4)
TOTAL = st.integers(0, 10**6)


@given(TOTAL, st.sets(IDS, min_size=1, max_size=20))
def test_the_shares_of_the_members_sum_to_the_global_batch(total: int, live: set[str]) -> None:
    shares = {me: batch.share(total, live, me) for me in live}
    n = len(live)
    if total >= n:
        assert sum(shares.values()) == total
        assert set(shares.values()) <= {total // n, total // n + 1}
    else:
        assert set(shares.values()) == {1}  # nobody trains on nothing
    # The extra samples go to the first ids in byte order.
    ordered = sorted(live)
    assert [shares[m] for m in ordered] == sorted(shares.values(), reverse=True)


@given(TOTAL, st.sets(IDS, max_size=20), IDS)
def test_a_learner_missing_from_the_list_counts_itself_in(
    total: int, live: set[str], me: str
) -> None:
    assert batch.share(total, live, me) == batch.share(total, live | {me}, me)
    assert batch.share(total, live, me) >= 1


@given(TOTAL, st.sets(IDS, min_size=1, max_size=20), st.data())
def test_shares_depend_on_membership_alone(total: int, live: set[str], data: st.DataObject) -> None:
    """Order and repetition in the list change nothing: every learner computes the same."""
    listed = data.draw(st.permutations(sorted(live)))
    me = data.draw(st.sampled_from(sorted(live)))
    assert batch.share(total, [*listed, *listed], me) == batch.share(total, live, me)


def run(config: AlgorithmConfig) -> list[RoundRecord]:
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    return cl.records(drive(c, 200, random.Random(4)))


def test_records_name_the_learners_their_closer_saw_live() -> None:
    """In a run that splits a global batch the closer writes membership into every record:
    all three live learners. A record without the list falls back to its participants."""
    records = run(AlgorithmConfig(sync_every=4, fragments=2, quorum=1, global_batch_size=64))
    assert len(records) >= 4
    late = records[len(records) // 2 :]
    assert all(r.live == ("n0", "n1", "n2") for r in late)
    assert all(batch.membership(r) == r.live for r in late)
    old = attrs.evolve(late[-1], live=())
    assert batch.membership(old) == tuple(sorted(p.learner for p in old.participants))


def test_runs_without_a_global_batch_write_records_as_before() -> None:
    """No list, so the record is byte for byte what gm before the field wrote and reads."""
    records = run(AlgorithmConfig(sync_every=4, fragments=2, quorum=1))
    assert records
    assert all(r.live == () for r in records)
    assert all(b'"live"' not in codec.encode(r) for r in records)
