"""Properties of gm_core.fallback: where the commit before an unusable one is, read totally."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from gm_core import codec, fallback, keys
from gm_core.auth import Envelope
from gm_core.records import (
    AlgorithmConfig,
    FragmentPlan,
    FragmentState,
    Manifest,
    PayloadRef,
    RoundRecord,
    Timing,
)
from gm_core.slots import SLOTS
from gm_core.tape import implausible, record_key

CONFIG = AlgorithmConfig(sync_every=8, fragments=2)
ENVELOPE = Envelope(run_id="run", auth=None)


def ref(round_: int, n: int) -> PayloadRef:
    return PayloadRef(key=keys.payload(round_, f"{n:064x}"), size=10, digest=f"{n:064x}")


INIT = tuple(FragmentState(version=0, theta=ref(0, f), momentum=None) for f in range(2))
MANIFEST = Manifest(
    run_id="run",
    created_by="n0",
    config=CONFIG,
    schema=(),
    plan=FragmentPlan(fragments=((), ())),
    init=INIT,
)


def record(round_: int, versions: tuple[int, int]) -> RoundRecord:
    """A plausible record of ``round_`` whose frontier holds ``versions``."""
    frontier = tuple(
        FragmentState(version=v, theta=ref(max(round_ - 1, 0), 100 + f), momentum=None)
        for f, v in enumerate(versions)
    )
    return RoundRecord(
        round=round_,
        step=(round_ + 1) * 4,
        fragment=round_ % 2,
        version=versions[round_ % 2],
        participants=(),
        rejections=(),
        cosine=None,
        timing=Timing(),
        quorum_s=0.0,
        grace_s=0.0,
        theta=frontier[round_ % 2].theta,
        outer=None,
        update=None,
        closer="n0",
        claim=0,
        next_closer="n0",
        frontier=frontier,
    )


rounds = st.integers(min_value=0, max_value=10**6)


@given(fragment=st.integers(0, 1), version=st.integers(1, 10**6), written=rounds)
def test_the_prior_of_a_commit_is_the_record_before_the_round_that_wrote_it(
    fragment: int, version: int, written: int
) -> None:
    found = fallback.prior(MANIFEST, fragment, version, ref(written, 7).key)
    if written == 0:
        assert found == INIT[fragment]
    else:
        assert found == fallback.Prior(
            fragment=fragment, version=version, key=ref(written, 7).key, round=written - 1
        )


@given(fragment=st.integers(0, 1), written=rounds)
def test_the_initial_state_has_no_prior(fragment: int, written: int) -> None:
    assert isinstance(fallback.prior(MANIFEST, fragment, 0, ref(written, 7).key), str)


@given(theta=st.text(max_size=80))
def test_a_key_that_is_not_a_payload_key_has_no_prior(theta: str) -> None:
    found = fallback.prior(MANIFEST, 0, 3, theta)
    assert isinstance(found, str) or keys.round_of_payload_key(theta) >= 0


@given(data=st.one_of(st.none(), st.binary(max_size=300)), slot=st.integers(0, SLOTS - 1))
def test_reading_any_bytes_gives_a_verdict(data: bytes | None, slot: int) -> None:
    at = fallback.Prior(fragment=1, version=5, key=ref(9, 1).key, round=8, slot=slot)
    found = fallback.read_prior(ENVELOPE, CONFIG, at, data)
    if isinstance(found, fallback.Prior):
        assert found == attrs.evolve(at, slot=slot + 1)
    else:
        assert isinstance(found, str)  # bytes that are no record of round 8 give no commit


@given(round_=st.integers(1, 1000), older=st.integers(0, 400), slot=st.integers(0, SLOTS - 1))
def test_a_record_yields_its_commit_only_when_older(round_: int, older: int, slot: int) -> None:
    r = record(round_, (older, older))
    at = fallback.Prior(fragment=1, version=older + 1, key=ref(round_ + 1, 1).key, round=round_)
    at = attrs.evolve(at, slot=slot)
    data = ENVELOPE.pack(record_key(ENVELOPE, round_, slot), r)
    if implausible(r, CONFIG) is not None:  # more versions than commits so far
        assert isinstance(fallback.read_prior(ENVELOPE, CONFIG, at, data), str | fallback.Prior)
        return
    assert fallback.read_prior(ENVELOPE, CONFIG, at, data) == r.frontier[1]
    same = attrs.evolve(at, version=older)
    assert isinstance(fallback.read_prior(ENVELOPE, CONFIG, same, data), str)


def test_the_last_slot_s_garbage_ends_the_search_by_name() -> None:
    at = fallback.Prior(fragment=0, version=2, key=ref(5, 1).key, round=4, slot=SLOTS - 1)
    found = fallback.read_prior(ENVELOPE, CONFIG, at, b"{}")
    assert isinstance(found, str)
    assert "record 4" in found


def test_the_lost_message_names_the_object_and_what_to_do() -> None:
    message = fallback.lost(1, "payloads/x.st", "it is gone")
    assert "fragment 1" in message
    assert "payloads/x.st" in message
    assert fallback.WHAT_TO_DO in message


def test_encoding_round_trips_the_record_used_above() -> None:
    r = record(6, (3, 3))
    assert codec.decode(RoundRecord, codec.encode(r)) == r
