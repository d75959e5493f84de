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

Plausibility. A record's round fixes much of what it may say: its fragment and
step follow from the schedule, a fragment's version counts its commits so far,
the sweep mark trails the round, and estimates are durations the timing rules
accept (:data:`gm_core.timing.MAX_ESTIMATE_S`). A record that
breaks one of these was not written by a correct closer of this run's config;
it is refused by name like an undecodable one, so no forged number (a version
at 2^63 - 1, a round at the end of the key space) reaches the arithmetic of the
machines that follow the tape. (Authenticating the writer is a separate check.)
"""

from __future__ import annotations

import attrs

from gm_core import codec, keys, schedule, timing
from gm_core.auth import Envelope, Unauthenticated
from gm_core.records import AlgorithmConfig, FragmentState, Head, Manifest, RoundRecord

LAST_ROUND = keys.ROUND_LIMIT // 2 - 1
"""The last round a record or head hint may name: half the key space (16,000 years at a
round a second), so every round a node derives from a plausible one (the next, a flush
of every fragment) still has a key."""


@attrs.frozen(kw_only=True)
class BadRecord:
    """A record object that exists but cannot be used (hostile or newer writer)."""

    round: int
    reason: str


def parse_record(
    envelope: Envelope, data: bytes, expected_round: int, config: AlgorithmConfig
) -> RoundRecord | BadRecord:
    """Open and decode the object at ``rounds/{expected_round}``, or say why it is unusable."""
    body = envelope.open(keys.round_record(expected_round), data)
    if isinstance(body, Unauthenticated):
        why = f"unauthenticated ({body.why}): {body.detail}"
        return BadRecord(round=expected_round, reason=why)
    try:
        record = codec.decode(RoundRecord, body)
    except codec.CodecError as error:
        return BadRecord(round=expected_round, reason=str(error))
    if record.round != expected_round:
        return BadRecord(
            round=expected_round, reason=f"record names round {record.round}, not its key's round"
        )
    reason = implausible(record, config)
    return record if reason is None else BadRecord(round=expected_round, reason=reason)


def implausible(record: RoundRecord, config: AlgorithmConfig) -> str | None:
    """Why no correct closer of a run with ``config`` wrote ``record`` (None: one could have)."""
    r, fragments = record.round, config.fragments
    if r > LAST_ROUND:
        return f"round {r} is past the last round {LAST_ROUND}"
    if record.fragment != schedule.fragment_of(r, fragments):
        return f"fragment {record.fragment} is not round {r}'s"
    if record.step != schedule.step_of(r, config.sync_every, fragments):
        return f"step {record.step} is not round {r}'s"
    if len(record.frontier) != fragments:
        return f"frontier has {len(record.frontier)} fragments, the run {fragments}"
    for f, fs in enumerate(record.frontier):
        commits = (r - f) // fragments + 1 if r >= f else 0
        if fs.version > commits:
            return f"fragment {f} is at version {fs.version} after {commits} rounds of it"
    if record.swept_below > r:
        return f"swept_below {record.swept_below} is past round {r}"
    estimates = (record.quorum_s, record.grace_s, *attrs.astuple(record.timing))
    if any(not (x is None or 0.0 <= x <= timing.MAX_ESTIMATE_S) for x in estimates):
        return f"a timing is not in [0, {timing.MAX_ESTIMATE_S:g}] s"
    return None


def parse_head(envelope: Envelope, data: bytes | None) -> int:
    """The round a head hint names, or -1 when there is no usable hint (start at round 0).

    An unauthenticated head is no hint: the tape itself is probed from its start.
    """
    body = None if data is None else envelope.open(keys.head(), data)
    if body is None or isinstance(body, Unauthenticated):
        return -1
    try:
        hint = codec.decode(Head, body).round
    except codec.CodecError:
        return -1
    return hint if hint <= LAST_ROUND else -1


def frontier_of(manifest: Manifest, record: RoundRecord | None) -> tuple[FragmentState, ...]:
    """The committed state of every fragment after ``record`` (the manifest's before round 0)."""
    return manifest.init if record is None else record.frontier
