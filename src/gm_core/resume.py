"""When a node saves its resume state, and which of its local progress a restart keeps.

Theory of operation
-------------------
The bucket keeps the shared model at every commit, but not what each node's own
training needs to go on where it was: its inner optimizer, learning-rate schedule,
data position, step count, and the local progress its parameters hold beyond the
commits it folded in. A node that opts in saves those at ``keys.resume(node)`` and,
restarted with the same id, restores them after joining from the newest commit.

When. It saves at commit boundaries, right after folding in a commit (between two
optimizer steps, where its state is whole), and not at every one: the state is
typically three times the model (Adam's moments and the progress), while a round
ships one fragment's delta. So a save is due once the node has folded in commits
of at least ``every`` rounds since the round of its previous save; by default
``every`` is the run's fragment count ``P``, one save per sync cycle (``H``
steps), which bounds the steps a restart repeats to about ``H`` plus the commits
in flight. A node also saves when it joins (so a crash before the first due save
still finds a state, and a state the node cannot store fails at once) and when it
closes (after the final flush: no progress is left then).

Local progress (:class:`Drift`). Per fragment, a save keeps the parameters minus a
*base*, with the steps and tokens trained since that base. Under ``carry`` the base
is the copy taken for this node's newest *published* snapshot of the fragment not yet
folded in (that snapshot's progress is in the bucket; a commit that merges it adds it
back), else the fragment's anchor (the commit it last folded in): exactly what carry
would lay over the next commit. A snapshot captured but not yet published is no base:
a crash before its upload would leave its progress nowhere, and everything trained
before its capture would be lost with it (a save just after a due step, and a kill
just after the save, lost half a cycle that way). Measured from the anchor instead,
the progress is all kept unless that snapshot did reach the bucket after all (then
:func:`keep` drops it, as below). Under ``overwrite``/``blend`` it is the anchor.

What a restart keeps (:func:`keep`). The restarted node holds the newest commit.
Laying a fragment's saved progress over it must not count any training twice,
and the pre-crash process may have published snapshots after the save whose
progress includes the saved one. So, per fragment:

* ``carry``: kept unless a commit merged a snapshot of this node of that fragment
  from a round after the base (or the save's round, for an anchor base), or such a
  snapshot still waits in an open round (it may yet be merged). The base's own
  snapshot is fine either way: merged, the commit holds what precedes the base;
  rejected or late, that part is lost (never counted twice).
* ``overwrite``/``blend``: kept only if no commit of the fragment happened since
  the save (a live learner would have dropped or blended it at that commit) and
  none of its snapshots waits.

A kept fragment's progress is laid over the newest commit and its anchor's counts
move back by the saved steps and tokens (:func:`resumed`), so the next snapshot
reports them with the parameters' delta to match. A dropped one leaves the node
at the newest commit, as a restart without saved progress does: the steps since
the last snapshot the commits merged are trained again from the saved data
position. The shell reads the records after the save (at most
:data:`MAX_RECORDS`; a node away longer keeps nothing) and looks for its own
snapshots in the rounds after the newest record, at most ``in_flight`` of them
(a process publishes at most that far past the commits it folded in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from gm_core.learner import LearnerState
from gm_core.records import Alignment, RoundRecord

MAX_RECORDS = 64
"""Records after a save a restarted node reads to decide what progress it keeps."""


def every_rounds(configured: int | None, fragments: int) -> int:
    """Rounds between two saves: ``configured``, or one sync cycle (``fragments``) if None."""
    every = fragments if configured is None else configured
    if every < 1:
        raise ValueError(f"a resume state is saved every {every} rounds: must be at least 1")
    return every


def due(aligned_round: int, saved_round: int, every: int) -> bool:
    """Whether a node that has folded in the commits up to ``aligned_round``, and saved last
    at ``saved_round`` (-1: before any commit), saves its resume state now."""
    return aligned_round >= saved_round + every


@attrs.frozen(kw_only=True)
class Drift:
    """A fragment's local progress at a save: what it is measured from, and its size."""

    version: int
    """The fragment's anchor version at the save."""
    base_round: int
    """The round of the snapshot whose copy is the base; -1: the base is the anchor."""
    steps: int
    tokens: int


def drifts(state: LearnerState, copies: frozenset[int]) -> tuple[Drift, ...]:
    """Each fragment's progress at a save of ``state``; ``copies``: the rounds whose
    snapshot copy the shell still holds (carry keeps one per snapshot in flight).

    ``state`` must have heard of every step and fold-in the model holds.
    """
    carry = state.manifest.config.alignment is Alignment.CARRY
    out = []
    for fragment, anchor in enumerate(state.anchors):
        bases = [
            r
            for r, o in state.outgoing.items()
            if carry
            and o.fragment == fragment
            and o.published
            and r in copies
            and r > state.aligned_round
        ]
        base_round = max(bases, default=-1)
        since = state.outgoing[base_round] if bases else anchor
        out.append(
            Drift(
                version=anchor.version,
                base_round=base_round,
                steps=state.step - since.step,
                tokens=state.tokens - since.tokens,
            )
        )
    return tuple(out)


def keep(
    saved: Sequence[Drift],
    *,
    alignment: Alignment,
    saved_round: int,
    node: str,
    records: Mapping[int, RoundRecord],
    waiting: Mapping[int, int],
    versions: Sequence[int],
) -> tuple[bool, ...]:
    """Which fragments' saved progress a restarted node lays over the commit it holds.

    ``records``: the records of the rounds after ``saved_round`` that the node read
    (every one up to the round it has folded in, in order); ``waiting``: rounds after
    those in which a snapshot of this node (the earlier process's) still waits, with its
    fragment; ``versions``: the fragments' versions the node holds now.
    """
    if len(records) > MAX_RECORDS:
        return tuple(False for _ in saved)
    published: dict[int, list[int]] = {}  # fragment -> rounds holding a snapshot of ours
    for r, record in records.items():
        if r > saved_round and node in {p.learner for p in record.participants}:
            published.setdefault(record.fragment, []).append(r)
    for r, fragment in waiting.items():
        published.setdefault(fragment, []).append(r)
    kept = []
    for fragment, drift in enumerate(saved):
        rounds = published.get(fragment, [])
        if drift.steps <= 0:
            kept.append(False)
        elif alignment is Alignment.CARRY:
            since = drift.base_round if drift.base_round >= 0 else saved_round
            kept.append(not any(r > since for r in rounds))
        else:
            unchanged = fragment < len(versions) and versions[fragment] == drift.version
            kept.append(unchanged and not any(r in waiting for r in rounds))
    return tuple(kept)


def resumed(state: LearnerState, saved: Sequence[Drift], kept: Sequence[bool]) -> LearnerState:
    """``state`` once the kept fragments' progress is back in the model: their anchors count
    the saved steps and tokens as trained since them."""
    anchors = list(state.anchors)
    for fragment, (drift, back) in enumerate(zip(saved, kept, strict=True)):
        if back:
            anchor = anchors[fragment]
            anchors[fragment] = attrs.evolve(
                anchor, step=anchor.step - drift.steps, tokens=anchor.tokens - drift.tokens
            )
    return attrs.evolve(state, anchors=tuple(anchors))
