"""Reading the tape: the round records, found by probing one expected key at a time.

Theory of operation
-------------------
Round records are written create-once and strictly in order (a closer writes
round ``r`` only after it holds record ``r - 1``), so the set of records is
always a prefix ``0..n-1`` of the rounds. A reader therefore never lists: it
GETs the one key it expects next, and a miss means "not yet". Joining starts
from ``head.json``, a hint of the newest round that the closer overwrites after
each commit; the hint may lag but never leads, so probing forward from it finds
the newest record in O(1) requests in the common case.

These helpers are shared by the learner and the closer; they only decode and
check, they hold no state.
"""

from __future__ import annotations

import attrs

from gm_core import codec
from gm_core.records import FragmentState, Head, Manifest, RoundRecord


@attrs.frozen(kw_only=True)
class BadRecord:
    """A record object that exists but cannot be used (hostile or newer writer)."""

    round: int
    reason: str


def parse_record(data: bytes, expected_round: int) -> RoundRecord | BadRecord:
    """Decode the object found at ``rounds/{expected_round}``, or say why it is unusable."""
    try:
        record = codec.decode(RoundRecord, data)
    except codec.CodecError as error:
        return BadRecord(round=expected_round, reason=str(error))
    if record.round != expected_round:
        return BadRecord(
            round=expected_round, reason=f"record names round {record.round}, not its key's round"
        )
    return record


def parse_head(data: bytes | None) -> int:
    """The round a head hint names, or -1 when there is no usable hint (start at round 0)."""
    if data is None:
        return -1
    try:
        return codec.decode(Head, data).round
    except codec.CodecError:
        return -1


def frontier_of(manifest: Manifest, record: RoundRecord | None) -> tuple[FragmentState, ...]:
    """The committed state of every fragment after ``record`` (the manifest's before round 0)."""
    return manifest.init if record is None else record.frontier
