"""The protocol's named invariants, as functions over a whole cluster and its store.

Theory of operation
-------------------
``spec/invariants.md`` names each invariant and states it in one sentence; each
is one function here, shared by the stateful tests, the simulator and the model
checker, so all three check the same thing. A state invariant maps a
:class:`ClusterView` (every node's state plus the model store and its ghost
history of create-once writes) to a tuple of violation messages, empty when it
holds. Two invariants are about moments rather than states: payload-before-
pointer is judged when a pointer is written (:func:`pointer_targets_exist`), and
learner monotonicity across one transition (:func:`learner_monotonic`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs

from gm_core import closer, codec, keys, learner, schedule, verdicts
from gm_core.records import Claim, FragmentState, Manifest, RoundRecord, Snapshot, Timing
from gm_core.store_model import ModelStore

V = TypeVar("V", bound=codec.Value)


@attrs.frozen(kw_only=True)
class ClusterView:
    manifest: Manifest
    schema_digest: str
    store: ModelStore
    learners: Mapping[str, learner.LearnerState] = attrs.field(factory=dict)
    closers: Mapping[str, closer.CloserState] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Violation:
    invariant: str
    message: str


_KINDS: Mapping[str, type[codec.Value]] = {k.__name__: k for k in (RoundRecord, Snapshot, Claim)}


@functools.lru_cache(maxsize=65536)
def _decoded(kind: str, data: bytes) -> codec.Value | None:
    """Created objects are immutable bytes, checked after every step: decode each once."""
    try:
        return codec.decode(_KINDS[kind], data)
    except codec.CodecError:
        return None


def _as(kind: type[V], data: bytes) -> V | None:
    """``data`` decoded as ``kind``, or None when it is not a valid one (hostile writes)."""
    value = _decoded(kind.__name__, data)
    return value if isinstance(value, kind) else None


def read_tape(view: ClusterView) -> dict[int, RoundRecord]:
    """Every round record in the store, by round (undecodable ones are left out)."""
    out: dict[int, RoundRecord] = {}
    for key in view.store.list(keys.ROUNDS_PREFIX):
        stored = view.store.get(key)
        parsed = _parse_or_none(key)
        if stored is None or not isinstance(parsed, keys.RoundKey):
            continue
        record = _as(RoundRecord, stored.data)
        if record is not None:
            out[parsed.round] = record
    return out


def _created(
    view: ClusterView, kind: type[keys.SnapshotKey] | type[keys.ClaimKey]
) -> dict[str, bytes]:
    return {k: d for k, d in view.store.created if isinstance(_parse_or_none(k), kind)}


@functools.lru_cache(maxsize=65536)
def _parse_or_none(key: str) -> keys.ParsedKey | None:
    try:
        return keys.parse(key)
    except keys.BadKey:
        return None


def _before(
    view: ClusterView, tape: dict[int, RoundRecord], round_: int
) -> tuple[FragmentState, ...]:
    previous = tape.get(round_ - 1)
    return view.manifest.init if previous is None else previous.frontier


def one_record_per_round(view: ClusterView) -> tuple[str, ...]:
    """Each round key was created once, and decodes to a record of that round."""
    seen: dict[str, int] = {}
    for key, _ in view.store.created:
        seen[key] = seen.get(key, 0) + 1
    out = [f"{k} created {n} times" for k, n in seen.items() if n > 1]
    tape = read_tape(view)
    for key in view.store.list(keys.ROUNDS_PREFIX):
        parsed = _parse_or_none(key)
        if not isinstance(parsed, keys.RoundKey) or parsed.round not in tape:
            out.append(f"{key} is not a decodable round record")
        elif tape[parsed.round].round != parsed.round:
            out.append(f"{key} holds round {tape[parsed.round].round}")
    return tuple(out)


def contiguous_tape(view: ClusterView) -> tuple[str, ...]:
    """The records present are exactly rounds 0..n-1."""
    rounds = sorted(read_tape(view))
    if rounds != list(range(len(rounds))):
        return (f"tape has gaps: {rounds}",)
    return ()


def record_consistency(view: ClusterView) -> tuple[str, ...]:
    """Each record moves exactly its own fragment's version by one, or by none if empty."""
    out = []
    tape = read_tape(view)
    for r, rec in sorted(tape.items()):
        before = _before(view, tape, r)
        if r > 0 and r - 1 not in tape:
            continue
        if len(rec.frontier) != len(before):
            out.append(f"round {r}: frontier has {len(rec.frontier)} fragments")
            continue
        bump = 1 if rec.participants else 0
        expected = before[rec.fragment].version + bump
        if rec.version != expected or rec.frontier[rec.fragment].version != expected:
            out.append(f"round {r}: version {rec.version}, expected {expected}")
        if not rec.participants and rec.frontier[rec.fragment] != before[rec.fragment]:
            out.append(f"round {r}: an empty round changed its fragment")
        if rec.frontier[rec.fragment].theta != rec.theta:
            out.append(f"round {r}: theta differs from the frontier's")
        others = [f for f in range(len(before)) if f != rec.fragment]
        if any(rec.frontier[f] != before[f] for f in others):
            out.append(f"round {r}: touched another fragment")
    return tuple(out)


def schedule_coverage(view: ClusterView) -> tuple[str, ...]:
    """Record r syncs fragment r mod P at step_of(r), so each fragment once per H steps."""
    cfg = view.manifest.config
    out = []
    for r, rec in read_tape(view).items():
        if rec.fragment != schedule.fragment_of(r, cfg.fragments):
            out.append(f"round {r}: fragment {rec.fragment}")
        if rec.step != schedule.step_of(r, cfg.sync_every, cfg.fragments):
            out.append(f"round {r}: step {rec.step}")
    return tuple(out)


def retention(view: ClusterView) -> tuple[str, ...]:
    """Every payload the newest frontier points at is still in the store."""
    tape = read_tape(view)
    frontier = tape[max(tape)].frontier if tape else view.manifest.init
    refs = [ref for fs in frontier for ref in (fs.theta, fs.momentum) if ref is not None]
    gone = [ref.key for ref in refs if view.store.get(ref.key) is None]
    return tuple(f"frontier payload {key} is gone" for key in gone)


def one_snapshot_per_learner_per_round(view: ClusterView) -> tuple[str, ...]:
    """A snapshot lives at its learner's key for its round, written once."""
    out = []
    for key, data in _created(view, keys.SnapshotKey).items():
        parsed = keys.parse(key)
        assert isinstance(parsed, keys.SnapshotKey)
        snap = _as(Snapshot, data)
        if snap is None:
            continue  # a malformed snapshot is the closer's to reject, not a protocol breach
        if (snap.learner, snap.round) != (parsed.learner, parsed.round):
            out.append(f"{key} holds a snapshot of {snap.learner} for round {snap.round}")
    return tuple(out)


def acceptance_soundness(view: ClusterView) -> tuple[str, ...]:
    """Every participant wrote a snapshot for that round that passes every verdict."""
    cfg = view.manifest.config
    snapshots = _created(view, keys.SnapshotKey)
    tape = read_tape(view)
    out = []
    for r, rec in tape.items():
        before = _before(view, tape, r)
        names = [p.learner for p in rec.participants]
        if names != sorted(set(names)):
            out.append(f"round {r}: participants not unique and sorted")
        if set(names) & {x.learner for x in rec.rejections}:
            out.append(f"round {r}: a learner both accepted and rejected")
        for p in rec.participants:
            data = snapshots.get(keys.snapshot(r, p.learner))
            snap = _as(Snapshot, data) if data is not None else None
            if snap is None:
                out.append(f"round {r}: {p.learner} never wrote a valid snapshot")
                continue
            verdict = verdicts.judge_snapshot(
                snap,
                round=r,
                fragment=rec.fragment,
                committed_version=before[rec.fragment].version,
                schema_digest=view.schema_digest,
                require_signatures=cfg.require_signatures,
                max_stale_versions=closer.max_stale_versions(cfg.in_flight, cfg.fragments),
            )
            facts = (snap.steps, snap.tokens, snap.base_version, snap.final)
            if verdict is not None or facts != (p.steps, p.tokens, p.base_version, p.final):
                out.append(f"round {r}: {p.learner} accepted unsoundly ({verdict})")
            elif p.weight != verdicts.merge_weight(snap.tokens, snap.steps):
                out.append(f"round {r}: {p.learner} weight {p.weight}")
    return tuple(out)


def single_committer(view: ClusterView) -> tuple[str, ...]:
    """Each record's closer was named by the previous record, or won the claim it cites."""
    claims = _created(view, keys.ClaimKey)
    tape = read_tape(view)
    out = []
    for r, rec in tape.items():
        previous = tape.get(r - 1)
        if r > 0 and previous is None:
            continue
        named = previous.next_closer if previous is not None else view.manifest.created_by
        if rec.claim == 0:
            if rec.closer != named:
                out.append(f"round {r}: {rec.closer} committed without a claim ({named} was named)")
            continue
        data = claims.get(keys.claim(r, rec.claim))
        claim = _as(Claim, data) if data is not None else None
        holder = claim.node if claim is not None else None
        if holder != rec.closer:
            out.append(f"round {r}: {rec.closer} cites claim {rec.claim} held by {holder}")
    return tuple(out)


def grace_bounds(view: ClusterView) -> tuple[str, ...]:
    """0 ≤ grace ≤ gap·ξ_step, and grace is 0 while any estimate was missing."""
    cfg = view.manifest.config
    tape = read_tape(view)
    out = []
    for r, rec in tape.items():
        previous = tape.get(r - 1)
        if r > 0 and previous is None:
            continue
        t = previous.timing if previous is not None else Timing()
        gap = schedule.gap_of(r, cfg.sync_every, cfg.fragments)
        if None in (t.step_s, t.quorum_s, t.sync_s):
            bound = 0.0
        else:
            assert t.step_s is not None
            bound = gap * t.step_s
        if not 0.0 <= rec.grace_s <= bound + 1e-9:
            out.append(f"round {r}: grace {rec.grace_s} outside [0, {bound}]")
    return tuple(out)


def learners_behind_commits(view: ClusterView) -> tuple[str, ...]:
    """No learner has aligned a round or a version that the tape does not hold."""
    tape = read_tape(view)
    newest = max(tape, default=-1)
    frontier = tape[newest].frontier if tape else view.manifest.init
    out = []
    for name, state in view.learners.items():
        if state.aligned_round > newest:
            out.append(f"{name} aligned round {state.aligned_round} > newest {newest}")
        for f, anchor in enumerate(state.anchors):
            if anchor.version > frontier[f].version:
                out.append(f"{name} fragment {f} at version {anchor.version}")
    return tuple(out)


STATE_INVARIANTS: Mapping[str, Callable[[ClusterView], tuple[str, ...]]] = {
    "one_record_per_round": one_record_per_round,
    "contiguous_tape": contiguous_tape,
    "record_consistency": record_consistency,
    "schedule_coverage": schedule_coverage,
    "retention": retention,
    "one_snapshot_per_learner_per_round": one_snapshot_per_learner_per_round,
    "acceptance_soundness": acceptance_soundness,
    "single_committer": single_committer,
    "grace_bounds": grace_bounds,
    "learners_behind_commits": learners_behind_commits,
}


def check(view: ClusterView) -> list[Violation]:
    """Every state invariant, in a fixed order."""
    return [
        Violation(invariant=name, message=message)
        for name, fn in STATE_INVARIANTS.items()
        for message in fn(view)
    ]


def pointer_targets_exist(store: ModelStore, key: str, data: bytes) -> tuple[str, ...]:
    """Payload before pointer: judged just before a snapshot or record is created.

    A snapshot for a round that is already committed is exempt: nobody will ever
    read it, and its payload may rightly have been swept between the learner's
    two writes (a slow learner publishing into a round closed long ago).
    """
    parsed = _parse_or_none(key)
    refs = []
    try:
        if isinstance(parsed, keys.SnapshotKey):
            if store.get(keys.round_record(parsed.round)) is not None:
                return ()
            refs = [codec.decode(Snapshot, data).payload]
        elif isinstance(parsed, keys.RoundKey):
            rec = codec.decode(RoundRecord, data)
            refs = [x for x in (rec.theta, rec.outer, rec.update) if x is not None]
    except codec.CodecError:
        return ()
    return tuple(f"{key} points at missing {ref.key}" for ref in refs if store.get(ref.key) is None)


def learner_monotonic(old: learner.LearnerState, new: learner.LearnerState) -> tuple[str, ...]:
    """Within one incarnation a learner never moves back on the tape or in any fragment."""
    out = []
    if new.aligned_round < old.aligned_round and old.phase is not learner.Phase.LOADING:
        out.append(f"{new.node}: aligned round {old.aligned_round} -> {new.aligned_round}")
    if old.anchors and new.anchors:
        for f, (a, b) in enumerate(zip(old.anchors, new.anchors, strict=True)):
            if b.version < a.version:
                out.append(f"{new.node}: fragment {f} version {a.version} -> {b.version}")
    if new.step < old.step or new.next_round < old.next_round:
        out.append(f"{new.node}: step or next round went back")
    return tuple(out)
