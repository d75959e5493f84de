"""Falling back from a committed payload that cannot be read (spec/protocol.md §16.10).

Theory of operation
-------------------
A record names its fragment's payloads by key, size and digest, and the payload
is written before the record, so an honest run never points at bytes that are
not there. A bucket is not always honest: an operator's cleanup, a lifecycle
rule, a failed restore or an attacker can delete or overwrite a committed
payload. A record is never rewritten, so every node that needs that commit
(a closer merging the next round of the fragment, a learner aligning to it, a
learner joining) would find the same unusable object at every try.

Instead, each of them falls back to the commit the fragment had before: the
state in the frontier of the record just before the round that wrote the
unusable payload (the round is in the payload's key), or the run's initial
state when that round is 0. Garbage collection keeps :data:`KEEP_CYCLES`
cycles of rounds, so the previous commit of a fragment that commits every cycle
is still there when the next round of the fragment closes. Only one step back
is taken: if the previous commit is unusable too (or was swept), the node halts
on that fragment with one message that names the object and what to do
(``commit_lost``), rather than walking an ever older tape.

A closer that falls back merges the round's deltas into the previous commit and
writes the next version as usual: versions keep counting commits, and the next
record's frontier no longer names the unusable payload, so the run has healed.
A lost momentum alone costs less: the theta it came with is kept and the outer
step restarts from zero momentum, as at a fragment's first commit.
"""

from __future__ import annotations

import attrs

from gm_core import keys
from gm_core.auth import Envelope
from gm_core.records import AlgorithmConfig, FragmentState, Manifest, RoundRecord
from gm_core.slots import SLOTS
from gm_core.tape import BadRecord, parse_record

WHAT_TO_DO = "restore the object from a copy of the bucket, or start a new run from a saved model"
"""The operator's options once no earlier commit is left (named in ``commit_lost``)."""


@attrs.frozen(kw_only=True)
class Prior:
    """The slot of record ``round`` to read: its frontier holds ``fragment``'s commit
    before version ``version`` (the unusable one)."""

    fragment: int
    version: int
    key: str
    """The unusable commit's theta payload (named if nothing replaces it)."""
    round: int
    slot: int = 0


def prior(
    manifest: Manifest, fragment: int, version: int, theta: str
) -> Prior | FragmentState | str:
    """Where the commit of ``fragment`` before version ``version`` (whose theta payload is
    at ``theta``) is: the manifest's initial state itself, a record to read, or why there
    is none."""
    if version == 0:
        return "it is the run's initial state, there is no earlier commit"
    try:
        written = keys.round_of_payload_key(theta)
    except keys.BadKey:
        return f"{theta} is not a payload key"
    if written == 0:
        return manifest.init[fragment]
    return Prior(fragment=fragment, version=version, key=theta, round=written - 1)


def read_prior(
    envelope: Envelope, config: AlgorithmConfig, at: Prior, data: bytes | None
) -> Prior | FragmentState | str:
    """The outcome of reading ``at``: the earlier commit, the next slot to read, or why
    there is no earlier commit to use."""
    if data is None:
        return f"record {at.round} is absent"
    parsed = parse_record(envelope, data, at.round, config, at.slot)
    if isinstance(parsed, BadRecord):
        if parsed.newer or at.slot + 1 >= SLOTS:
            return f"record {at.round} cannot be read: {parsed.reason}"
        return attrs.evolve(at, slot=at.slot + 1)
    return earlier(parsed, at)


def earlier(record: RoundRecord, at: Prior) -> FragmentState | str:
    """``record``'s state of the fragment, if it is older than the unusable commit."""
    state = record.frontier[at.fragment]
    if state.version >= at.version:
        return f"record {at.round} names version {state.version}, not an earlier one"
    return state


def without_momentum(unusable: FragmentState) -> FragmentState:
    """The commit with its unusable momentum dropped: the outer step starts afresh."""
    return attrs.evolve(unusable, momentum=None)


def lost(fragment: int, key: str, why: str) -> str:
    """The ``commit_lost`` message: the object, why nothing replaces it, and what to do."""
    return f"fragment {fragment}: {key} is unusable and {why}; {WHAT_TO_DO}"
