"""Verdicts of a closer: which snapshots count, how much each weighs, when to close.

Theory of operation
-------------------
A closer judges each snapshot from its record alone before it fetches any payload:
a record that contradicts the folder it was found in or the committed state is
rejected with a :class:`~gm_core.records.Reason` that goes into the round record,
so every rejection is visible on the tape. Payload checks (missing bytes, bad
digest, non-finite values) happen later and are not decided here.

Accepted deltas are merged with weights ``tokens² / steps``: a learner that saw
more data counts more, and one that took many small steps to see it counts less.
A round closes once a quorum of snapshots is accepted, or once every live learner
has reported — there is nobody left worth waiting for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gm_core.records import Reason, Snapshot


def judge_snapshot(
    snapshot: Snapshot,
    *,
    round: int,
    fragment: int,
    committed_version: int,
    schema_digest: str,
    require_signatures: bool,
    max_stale_versions: int = 0,
) -> Reason | None:
    """Judge a snapshot found in round ``round``'s folder; None means accepted so far.

    ``committed_version`` is the current committed version of ``fragment`` (the
    fragment the schedule assigns to ``round``). Checks run in this order, and the
    first that fails is the verdict:

    1. ``CORRUPT`` — the record contradicts itself or its place: its round or
       fragment differs from the folder's round / the schedule's fragment, a count
       is negative (``steps``, ``tokens``, ``base_version``), or its
       ``base_version`` is newer than anything committed. Such a record was not
       written by a correct learner for this round, so nothing else about it is
       worth reporting.
    2. ``SCHEMA`` — the delta was computed for another model.
    3. ``ZERO_STEPS`` — it carries no training (its weight would divide by zero).
    4. ``STALE`` — its base is more than ``max_stale_versions`` versions behind.
    5. ``UNSIGNED`` — the run requires signatures and it has none. Verifying a
       signature's value is the shell's job; here only its presence is judged.

    Peer data never raises here; only a caller's misuse does (a negative round,
    fragment, version or staleness bound).
    """
    if round < 0 or fragment < 0 or committed_version < 0:
        raise ValueError(
            f"round, fragment and committed_version must be >= 0, "
            f"got {round}, {fragment}, {committed_version}"
        )
    if max_stale_versions < 0:
        raise ValueError(f"max_stale_versions must be >= 0, got {max_stale_versions}")
    if snapshot.round != round or snapshot.fragment != fragment:
        return Reason.CORRUPT
    if snapshot.steps < 0 or snapshot.tokens < 0 or snapshot.base_version < 0:
        return Reason.CORRUPT
    if snapshot.base_version > committed_version:
        return Reason.CORRUPT
    if snapshot.schema_digest != schema_digest:
        return Reason.SCHEMA
    if snapshot.steps == 0:
        return Reason.ZERO_STEPS
    if committed_version - snapshot.base_version > max_stale_versions:
        return Reason.STALE
    if require_signatures and not snapshot.signature:
        return Reason.UNSIGNED
    return None


def merge_weight(tokens: int, steps: int) -> float:
    """A snapshot's merge weight, ``tokens² / steps``.

    Raises for ``steps < 1`` or ``tokens < 0``: judge_snapshot rejects such
    snapshots first, so reaching here with them is the caller's bug.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return tokens * tokens / steps


def normalized_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """The weights scaled to sum to 1; all zero gives equal weights; empty gives ().

    All-zero happens when every accepted learner reports zero tokens (e.g. a model
    trained on something the shell does not count); equal weights then keep the
    round useful instead of dividing by zero. Weights are first divided by their
    maximum so that the sum can neither overflow nor underflow.
    """
    for weight in weights:
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weights must be finite and >= 0, got {weight}")
    if not weights:
        return ()
    largest = max(weights)
    if largest == 0:
        return tuple(1.0 / len(weights) for _ in weights)
    scaled = [weight / largest for weight in weights]
    total = math.fsum(scaled)
    return tuple(weight / total for weight in scaled)


def capped_shares(shares: Sequence[float], factor: float | None) -> tuple[float, ...]:
    """``shares`` (summing to 1) with none above ``factor`` times an equal share ``1/n``.

    A snapshot's weight comes from counts its learner reports, so one learner
    claiming 2^63 tokens would otherwise take the whole merge. Shares above the cap
    are set to it and the excess goes to the others in proportion to their shares,
    repeatedly, until none exceeds it (water-filling): the result sums to 1, keeps
    the order of the shares, and equals the input when no share exceeds the cap.
    ``None`` (or a factor that allows a share of 1) caps nothing. Shares are assumed
    normalized (:func:`normalized_weights`).
    """
    n = len(shares)
    if factor is None or n == 0 or factor >= n:
        return tuple(shares)
    cap = max(factor, 1.0) / n
    capped: set[int] = set()
    out = list(shares)
    while True:
        over = {i for i in range(n) if i not in capped and out[i] > cap}
        if not over:
            return tuple(out)
        capped |= over
        free = [i for i in range(n) if i not in capped]
        left = 1.0 - cap * len(capped)
        mass = math.fsum(out[i] for i in free)
        for i in capped:
            out[i] = cap
        for i in free:
            out[i] = left * out[i] / mass if mass > 0 else left / len(free)


def ready_to_close(
    *,
    accepted: int,
    reported: frozenset[str],
    live: frozenset[str],
    quorum: int,
    lapsed: frozenset[str] = frozenset(),
) -> bool:
    """Whether the closer may stop waiting for snapshots (grace may still follow).

    True when ``accepted >= quorum``, or when every live learner has reported
    (``live ⊆ reported``) and someone is known: live, or ``lapsed`` (its lease was
    live while this round was open and is stale now) — whatever the verdicts were.
    So a round in which everyone reported and every snapshot was rejected still
    closes, with no participants: it commits no new version, and waiting longer
    could only wait for a learner that is not live. A learner that cannot publish
    a round pauses its lease so that the round closes without it (spec §7.5); when
    it was the only one, the round closes empty, or the learner, waiting for the
    round's record to renew its lease, would wait forever. With nobody live that
    round, the round stays open (nothing to merge, nobody to wait for; it closes
    when someone reports or a quorum arrives).
    """
    if quorum < 1:
        raise ValueError(f"quorum must be >= 1, got {quorum}")
    if accepted < 0:
        raise ValueError(f"accepted must be >= 0, got {accepted}")
    if accepted >= quorum:
        return True
    return bool(live or lapsed) and live <= reported
