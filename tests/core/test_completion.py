"""Properties of run completion: a run is finished exactly when no learner is live and every
slice of its data has a counted completion (the lowest valid attempt's marker), and the
totals count each slice once, whatever duplicates and garbage the bucket holds."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gm_core import completion
from gm_core.completion import (
    DoneMarker,
    Finished,
    Markers,
    NotFinished,
    Plain,
    Queued,
    Ranked,
    Shape,
    Slice,
)

IDS = st.text(string.ascii_lowercase, min_size=1, max_size=3)
COUNTS = st.integers(0, 10**6)


def marker_at(attempt: int) -> st.SearchStrategy[DoneMarker | None]:
    valid = st.builds(DoneMarker, node=IDS, attempt=st.just(attempt), steps=COUNTS, tokens=COUNTS)
    return st.one_of(st.none(), valid)  # None: a garbage marker, refused when read


def attempts() -> st.SearchStrategy[dict[int, DoneMarker | None]]:
    return st.lists(st.integers(0, 5), max_size=4, unique=True).flatmap(
        lambda nums: st.fixed_dictionaries({a: marker_at(a) for a in nums})
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[Shape, Markers, frozenset[str]]:
    kind = draw(st.sampled_from(["plain", "ranked", "queued"]))
    slices: list[Slice]
    shape: Shape
    if kind == "ranked":
        shape = Ranked(draw(st.integers(1, 4)))
        slices = list(range(shape.ranks + 1))  # one rank past N: a stray
    elif kind == "queued":
        units = draw(st.frozensets(IDS, min_size=1, max_size=4))
        shape = Queued(units)
        slices = [*units, "zzzz"]  # an unknown unit: a stray
    else:
        shape = Plain()
        slices = draw(st.lists(IDS, max_size=4, unique=True))
    markers = {s: draw(attempts()) for s in slices if draw(st.booleans())}
    live = draw(st.frozensets(IDS, max_size=2))
    return shape, markers, live


def expected_slices(shape: Shape, markers: Markers) -> list[Slice]:
    if isinstance(shape, Ranked):
        return list(range(shape.ranks))
    if isinstance(shape, Queued):
        return sorted(shape.units)
    return sorted(s for s in markers if isinstance(s, str))


def oracle_counted(attempts: dict[int, DoneMarker | None]) -> DoneMarker | None:
    """The rule restated: walk the attempts upwards, take the first valid marker."""
    for attempt in sorted(attempts):
        if attempts[attempt] is not None:
            return attempts[attempt]
    return None


@given(runs())
def test_finished_exactly_when_no_learner_is_live_and_every_slice_is_counted(
    run: tuple[Shape, Markers, frozenset[str]],
) -> None:
    shape, markers, live = run
    verdict = completion.finished(shape, markers, live)
    slices = expected_slices(shape, markers)
    done = {s: c for s in slices if (c := oracle_counted(dict(markers.get(s, {})))) is not None}
    complete = bool(done) if isinstance(shape, Plain) else len(done) == len(slices)
    assert isinstance(verdict, Finished) == (complete and not live)
    if isinstance(verdict, Finished):
        assert dict(verdict.counted) == done
        assert verdict.tokens == sum(m.tokens for m in done.values())
        assert verdict.steps == sum(m.steps for m in done.values())
    else:
        assert verdict.live == tuple(sorted(live))
        if not isinstance(shape, Plain):
            missing = [s for s in slices if s not in done]
            assert verdict.missing_count == len(missing)
            assert list(verdict.missing) == missing[: completion.MISSING_SHOWN]


@given(runs(), st.integers(6, 9), st.data())
def test_a_later_attempts_marker_never_changes_the_verdict(
    run: tuple[Shape, Markers, frozenset[str]], attempt: int, data: st.DataObject
) -> None:
    """A successor (or a forger) finishing a slice again, under a higher attempt than any
    listed, changes nothing for a slice already counted."""
    shape, markers, live = run
    before = completion.finished(shape, markers, live)
    counted_slices = [s for s, a in markers.items() if completion.counted(a) is not None]
    assume(counted_slices)
    target = data.draw(st.sampled_from(counted_slices))
    extra = data.draw(marker_at(attempt))
    after_markers = {**markers, target: {**markers[target], attempt: extra}}
    assert completion.finished(shape, after_markers, live) == before


@given(runs(), IDS)
def test_a_live_learner_keeps_the_run_open(
    run: tuple[Shape, Markers, frozenset[str]], learner: str
) -> None:
    shape, markers, live = run
    assert isinstance(completion.finished(shape, markers, live | {learner}), NotFinished)


@given(st.integers(1, 4), st.data())
def test_a_rank_nobody_claimed_keeps_a_ranked_run_open(ranks: int, data: st.DataObject) -> None:
    """The reference finishes once every rank *ever claimed* is done; gm needs all N."""
    skipped = data.draw(st.integers(0, ranks - 1))
    markers = {
        r: {0: DoneMarker(node=f"n{r}", attempt=0, steps=1, tokens=1)}
        for r in range(ranks)
        if r != skipped
    }
    verdict = completion.finished(Ranked(ranks), markers, frozenset())
    assert verdict == NotFinished(missing=(skipped,), missing_count=1, live=())


@given(IDS, st.integers(0, 9), COUNTS, COUNTS)
def test_done_markers_round_trip_and_name_their_attempt(
    node: str, attempt: int, steps: int, tokens: int
) -> None:
    marker = DoneMarker(node=node, attempt=attempt, steps=steps, tokens=tokens)
    data = completion.encode_done(marker)
    assert completion.decode_done(data, attempt) == marker
    assert isinstance(completion.decode_done(data, attempt + 1), str)


GARBAGE = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b'{"format":1,"node":"a","attempt":0,"steps":-1,"tokens":0}',
            b'{"format":1,"node":"a","attempt":0,"steps":1.5,"tokens":0}',
            b'{"format":1,"node":"a","attempt":0,"steps":true,"tokens":0}',
            b'{"format":1,"node":"a","attempt":0,"steps":9223372036854775808,"tokens":0}',
            b'{"format":2,"node":"a","attempt":0,"steps":1,"tokens":0}',
            b'{"format":1,"node":"../a","attempt":0,"steps":1,"tokens":0}',
            b'{"format":1,"node":"a","attempt":0,"steps":1,"tokens":0,"x":0}',
            b'{"format":1,"node":7,"attempt":0,"steps":1,"tokens":0}',
            b"[" * 10_000,
        ]
    ),
)


@given(GARBAGE)
def test_garbage_done_markers_are_refused_by_name(data: bytes) -> None:
    assert isinstance(completion.decode_done(data, 0), str)


def test_a_shape_without_slices_is_misuse() -> None:
    with pytest.raises(ValueError, match="ranks"):
        Ranked(0)
    with pytest.raises(ValueError, match="units"):
        Queued(frozenset())
