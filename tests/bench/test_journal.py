"""The journal's count of sequential requests (``waves``): the longest chain of requests
each of which started once the one before it had ended."""

from __future__ import annotations

import itertools

from bench.reference.journal import Request, waves
from hypothesis import given, settings
from hypothesis import strategies as st


def request(started: float, ended: float) -> Request:
    return Request(started, ended, "n0", "GET", 1, "rounds", "rounds/x")


intervals = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 10)).map(lambda t: request(t[0], t[0] + t[1])),
    max_size=9,
)


def chained(rs: tuple[Request, ...]) -> bool:
    return all(a.ended <= b.started for a, b in itertools.pairwise(rs))


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_waves_is_the_longest_chain_of_requests_one_after_another(rs: list[Request]) -> None:
    """Against every subset (at most 9 requests): the longest that can be ordered so that
    each starts once the one before ended."""
    ordered = sorted(rs, key=lambda r: (r.started, r.ended))
    longest = max(
        (len(c) for n in range(len(rs) + 1) for c in itertools.combinations(ordered, n)
         if chained(c)),
        default=0,
    )  # fmt: skip
    assert waves(rs) == longest


def test_two_requests_in_a_row_beside_a_long_one_count_two() -> None:
    """What counting overlapping groups got wrong: one group, two requests in a row."""
    assert waves([request(0, 10), request(1, 2), request(3, 4)]) == 2
    assert waves([]) == 0
    assert waves([request(5, 5), request(0, 5)]) == 2  # one ends as the other (empty) starts
