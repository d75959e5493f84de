"""The protocol's named invariants, as functions over a whole cluster and its store.

Theory of operation
-------------------
``spec/invariants.md`` names each invariant and states it in one sentence; each
is one function here, shared by the stateful tests, the simulator and the model
checker, so all three check the same thing. A state invariant maps a
:class:`ClusterView` (every node's state plus the model store and its ghost
history of create-once writes) to a tuple of violation messages, empty when it
holds. Six invariants are about moments rather than states: payload-before-
pointer is judged when a pointer is written (:func:`pointer_targets_exist`),
learner monotonicity across one transition (:func:`learner_monotonic`), the
closing rule, judged on what a closer knew when it decided to close and reported
when its record is created (:func:`closing_rule`), the merge weights when a
merge is carried out (:func:`merge_weights`), and ``follow``'s: a marker written
only at its threshold (:func:`follow_marker_written`) and taken only when the run
wrote one (:func:`follow_after_marker`).

Independence. An invariant that called the function it checks would agree with
any bug in it. So the rules are re-stated here in their own few lines, from the
spec rather than from the code: the schedule in its closed form
``floor((r+1)·H/P)`` (the code uses the cycle-plus-offset form), the record-level
acceptance of a snapshot, the staleness bound, the merge weight ``tokens²/steps``
and its normalization, and the closing condition. A snapshot is judged against
the round whose folder it was listed in (the key), never the round it claims.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import attrs

from gm_core import auth, closer, codec, election, keys, learner
from gm_core.closer import commit
from gm_core.commands import Merge
from gm_core.records import (
    FORMAT_2,
    AlgorithmConfig,
    Claim,
    FragmentState,
    Manifest,
    PayloadRef,
    RoundRecord,
    Snapshot,
    Timing,
)
from gm_core.store_model import ModelStore

V = TypeVar("V", bound=codec.Value)


@attrs.frozen(kw_only=True)
class ClusterView:
    manifest: Manifest
    schema_digest: str
    store: ModelStore
    learners: Mapping[str, learner.LearnerState] = attrs.field(factory=dict)
    closers: Mapping[str, closer.CloserState] = attrs.field(factory=dict)
    members: frozenset[str] = frozenset()
    """Every node of the run, alive or not (empty: not known, not judged)."""
    tampered: frozenset[str] = frozenset()
    """Keys outsiders deleted or overwrote: their absence is not the protocol's doing."""


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


_ROUND_SCOPED = (keys.SnapshotKey, keys.ClaimKey, keys.PayloadKey, keys.FollowKey)
"""Kinds of keys written for one round's decision (the round is in the key)."""


def timely(store: ModelStore) -> tuple[tuple[str, bytes], ...]:
    """The ghost history of creations, late re-creations left out.

    A creation is a *late re-creation* when its key was created before, belongs to round
    ``r`` (a snapshot, claim, payload or follow marker) and a record of round ``r`` was
    created in between (spec/protocol.md §15.4): garbage collection swept the key after
    the round was decided, so the object can take no part in that decision, and late
    collection deletes it — e.g. a restarted learner re-publishing the round its earlier
    incarnation had published (swarm seed 101760). Every other re-creation is still a
    violation. A key's first creation always counts, so a history whose order is not
    the order of writes (the runtime tests' bucket reading, sorted by key) loses nothing.
    """
    decided: set[int] = set()
    seen: set[str] = set()
    out = []
    for key, data in store.created:
        parsed = _parse_or_none(key)
        if isinstance(parsed, keys.RoundKey):
            record = _as(RoundRecord, data)
            if record is not None:
                decided.add(record.round)
        elif isinstance(parsed, _ROUND_SCOPED) and parsed.round in decided and key in seen:
            continue
        seen.add(key)
        out.append((key, data))
    return tuple(out)


def _created(
    view: ClusterView, kind: type[keys.SnapshotKey] | type[keys.ClaimKey]
) -> dict[str, bytes]:
    """The objects of ``kind`` created in time, by key (each key once: see
    :func:`one_record_per_round`)."""
    return {k: d for k, d in timely(view.store) if isinstance(_parse_or_none(k), kind)}


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


# --- the rules, re-stated from the spec (never by calling the code they check) ----------------


def _due_step(round_: int, sync_every: int, fragments: int) -> int:
    """protocol.md §4: round r is due at step floor((r+1)·H/P) (closed form)."""
    return (round_ + 1) * sync_every // fragments


def _gap(round_: int, sync_every: int, fragments: int) -> int:
    """Steps between round r−1's step and round r's (round 0: from step 0)."""
    before = _due_step(round_ - 1, sync_every, fragments) if round_ > 0 else 0
    return _due_step(round_, sync_every, fragments) - before


def _weight(snap: Snapshot) -> float:
    """protocol.md §11.2: a snapshot weighs tokens²/steps."""
    return snap.tokens**2 / snap.steps


def _unacceptable(
    snap: Snapshot, round_: int, committed: int, cfg: AlgorithmConfig, schema_digest: str
) -> str | None:
    """Why a snapshot listed in round ``round_``'s folder must be rejected (protocol.md
    §11.1, record level), or None when a closer may accept it.

    ``committed`` is the committed version of the round's fragment before the round.
    Only acceptance matters here, not which reason comes first. (One that names another
    round is no snapshot of the folder at all: :func:`_snapshot_of` never returns it.)
    """
    # A learner publishes r after aligning r - in_flight; the fragment's previous
    # commit is r - P: its base may lag ceil(in_flight / P) - 1 versions.
    stale_bound = max(0, (cfg.in_flight + cfg.fragments - 1) // cfg.fragments - 1)
    rules = (
        (snap.fragment == round_ % cfg.fragments, f"has fragment {snap.fragment}"),
        (min(snap.steps, snap.tokens, snap.base_version) >= 0, "has a negative count"),
        (snap.base_version <= committed, f"has base {snap.base_version} > {committed}"),
        (snap.schema_digest == schema_digest, "is of another model"),
        (snap.steps > 0, "has no steps"),
        (committed - snap.base_version <= stale_bound, f"is stale (base {snap.base_version})"),
        (bool(snap.signature) or not cfg.require_signatures, "is unsigned"),
    )
    return next((why for ok, why in rules if not ok), None)


# --- state invariants -----------------------------------------------------------------------


def one_record_per_round(view: ClusterView) -> tuple[str, ...]:
    """Each key was created once in time (:func:`timely`), and each round key decodes to a
    record of that round."""
    seen: dict[str, int] = {}
    for key, _ in timely(view.store):
        seen[key] = seen.get(key, 0) + 1
    out = [f"{k} created {n} times" for k, n in seen.items() if n > 1]
    tape = read_tape(view)
    slots: dict[int, int] = {}
    for key in view.store.list(keys.ROUNDS_PREFIX):
        parsed = _parse_or_none(key)
        if not isinstance(parsed, keys.RoundKey) or parsed.round not in tape:
            out.append(f"{key} is not a decodable round record")
        elif tape[parsed.round].round != parsed.round:
            out.append(f"{key} holds round {tape[parsed.round].round}")
        else:
            slots[parsed.round] = slots.get(parsed.round, 0) + 1
    # Two slots of one round holding the run's records: two writers disagreed on the winner.
    out += [f"round {r} has records in {n} slots" for r, n in sorted(slots.items()) if n > 1]
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
    """Record r syncs fragment r mod P at step floor((r+1)·H/P): each fragment once per H."""
    cfg = view.manifest.config
    out = []
    for r, rec in read_tape(view).items():
        if rec.fragment != r % cfg.fragments:
            out.append(f"round {r}: fragment {rec.fragment}")
        if rec.step != _due_step(r, cfg.sync_every, cfg.fragments):
            out.append(f"round {r}: step {rec.step}")
    return tuple(out)


def retention(view: ClusterView) -> tuple[str, ...]:
    """Every payload the newest frontier points at is still in the store, unless an
    outsider removed it (garbage collection never deletes what the frontier names)."""
    tape = read_tape(view)
    frontier = tape[max(tape)].frontier if tape else view.manifest.init
    refs = [ref for fs in frontier for ref in (fs.theta, fs.momentum) if ref is not None]
    gone = [
        ref.key for ref in refs if view.store.get(ref.key) is None and ref.key not in view.tampered
    ]
    return tuple(f"frontier payload {key} is gone" for key in gone)


def one_snapshot_per_learner_per_round(view: ClusterView) -> tuple[str, ...]:
    """A snapshot lives at one of its learner's slots for its round, and only one is written
    (a learner that finds a snapshot of its own at a slot gives the round up, §16.4.2)."""
    out = []
    seen: dict[tuple[int, str], str] = {}
    for key, data in _created(view, keys.SnapshotKey).items():
        parsed = keys.parse(key)
        assert isinstance(parsed, keys.SnapshotKey)
        snap = _as(Snapshot, data)
        if snap is None:
            continue  # a malformed snapshot is the closer's to reject, not a protocol breach
        if (snap.learner, snap.round) != (parsed.learner, parsed.round):
            out.append(f"{key} holds a snapshot of {snap.learner} for round {snap.round}")
        elif (first := seen.setdefault((snap.round, snap.learner), key)) != key:
            out.append(f"{snap.learner} wrote two snapshots of round {snap.round}: {first}, {key}")
    return tuple(out)


def _snapshot_of(
    items: Iterable[tuple[str, bytes]], round_: int, learner: str, payload: PayloadRef | None = None
) -> Snapshot | None:
    """``learner``'s snapshot of ``round_``, at whichever of its slots holds one (the one
    naming ``payload`` if several were created, else the first)."""
    found = []
    for key, data in items:
        parsed = _parse_or_none(key)
        if isinstance(parsed, keys.SnapshotKey) and (parsed.round, parsed.learner) == (
            round_,
            learner,
        ):
            snap = _as(Snapshot, data)
            if snap is not None and (snap.learner, snap.round) == (learner, round_):
                found.append(snap)
    return next((x for x in found if x.payload == payload), found[0] if found else None)


_Items = list[tuple[str, bytes]]


def _by_writer(items: Iterable[tuple[str, bytes]]) -> dict[tuple[int, str], _Items]:
    """Snapshot keys and bodies by the (round, learner) their key names, in order: what
    :func:`_snapshot_of` looks through for one of them, found once for many."""
    out: dict[tuple[int, str], _Items] = {}
    for key, data in items:
        parsed = _parse_or_none(key)
        if isinstance(parsed, keys.SnapshotKey):
            out.setdefault((parsed.round, parsed.learner), []).append((key, data))
    return out


def acceptance_soundness(view: ClusterView) -> tuple[str, ...]:
    """Every participant wrote a snapshot in that round's folder that a closer may accept."""
    cfg = view.manifest.config
    snapshots = _by_writer(_created(view, keys.SnapshotKey).items())
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
            snap = _snapshot_of(snapshots.get((r, p.learner), ()), r, p.learner)
            if snap is None:
                out.append(f"round {r}: {p.learner} never wrote a valid snapshot")
                continue
            committed = before[r % cfg.fragments].version
            why = _unacceptable(snap, r, committed, cfg, view.schema_digest)
            facts = (snap.steps, snap.tokens, snap.base_version, snap.final)
            if why is not None:
                out.append(f"round {r}: {p.learner} accepted, but its snapshot {why}")
            elif facts != (p.steps, p.tokens, p.base_version, p.final):
                out.append(f"round {r}: {p.learner} misquoted: {facts}")
            elif p.weight != _weight(snap):
                out.append(f"round {r}: {p.learner} weight {p.weight}, not {_weight(snap)}")
    return tuple(out)


def _claims(view: ClusterView) -> list[Claim]:
    """The claims created, each where its body says it belongs: at its attempt's number, at
    a keyed name (an authenticated run's, §16.4.4: only what opens is in the view), or at
    the public name of its attempt (a format-2 open run's, where anyone can write a body
    naming one attempt at another's name: the name is the hash every reader computes,
    not a rule of the code checked here)."""
    open_run = auth.for_run(view.manifest.run_id, None, FORMAT_2)
    out = []
    for key, data in _created(view, keys.ClaimKey).items():
        parsed, claim = _parse_or_none(key), _as(Claim, data)
        if not isinstance(parsed, keys.ClaimKey) or claim is None or claim.round != parsed.round:
            continue
        misnamed = view.manifest.auth is None and parsed.attempt is None
        if misnamed and key != election.claim_key(open_run, claim.round, claim.attempt):
            continue
        if parsed.attempt in (None, claim.attempt):
            out.append(claim)
    return out


def single_committer(view: ClusterView) -> tuple[str, ...]:
    """Each record's closer was named by the previous record, or won the claim it cites."""
    claims = _claims(view)
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
        holders = sorted(c.node for c in claims if (c.round, c.attempt) == (r, rec.claim))
        if holders != [rec.closer]:
            out.append(f"round {r}: {rec.closer} cites claim {rec.claim} held by {holders}")
    return tuple(out)


def grace_bounds(view: ClusterView) -> tuple[str, ...]:
    """0 ≤ grace ≤ gap·ξ_step, and grace is 0 while any estimate was missing; with a fixed
    ``grace_seconds``, 0 ≤ grace ≤ that."""
    cfg = view.manifest.config
    tape = read_tape(view)
    out = []
    if cfg.grace_seconds is not None:  # fixed: never more, whatever the estimates say
        fixed = cfg.grace_seconds
        bad = [(r, rec.grace_s) for r, rec in tape.items() if not 0.0 <= rec.grace_s <= fixed]
        return tuple(f"round {r}: grace {grace} outside [0, {fixed}]" for r, grace in bad)
    for r, rec in tape.items():
        previous = tape.get(r - 1)
        if r > 0 and previous is None:
            continue
        t = previous.timing if previous is not None else Timing()
        gap = _gap(r, cfg.sync_every, cfg.fragments)
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


FORGED_TOKENS = 10**9 + 7
"""The tokens the model checker's forger claims in every snapshot it writes: no node of a
model cluster reports that many, so a record that merges it merged a forgery, whatever id
the forgery bore (a member forging in another learner's name, gm_core.check.forger)."""


def forgeries_ignored(view: ClusterView) -> tuple[str, ...]:
    """Nothing an outsider wrote is acted on (spec/invariants.md §F): no record of the run
    merges a learner that is not a node of it, nor a snapshot the forger wrote (its
    :data:`FORGED_TOKENS`), and every record a node holds is the one the run's own closers
    wrote for that round."""
    tape = read_tape(view)
    out = [
        f"round {r}: merges {p.learner}, not a node of the run"
        for r, record in sorted(tape.items())
        for p in record.participants
        if view.members and p.learner not in view.members
    ]
    out += [
        f"round {r}: merges the forger's snapshot in {p.learner}'s name"
        for r, record in sorted(tape.items())
        for p in record.participants
        if p.tokens == FORGED_TOKENS and p.learner in view.members
    ]
    held = [(name, c.last) for name, c in sorted(view.closers.items()) if c.last is not None]
    held += [
        (name, record)
        for name, state in sorted(view.learners.items())
        for record in state.fetched.values()
    ]
    out += [
        f"{name} holds a round {record.round} record the run did not write"
        for name, record in held
        if tape.get(record.round) != record
    ]
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _chain_digest(value: Manifest | RoundRecord) -> str:
    """The SHA-256 of ``value``'s canonical encoding. Records are checked after every step
    and each is decoded once (:func:`_decoded`): its digest is computed once too."""
    return hashlib.sha256(codec.encode(value)).hexdigest()


def chained_tape(view: ClusterView) -> tuple[str, ...]:
    """In a chained run, every record names the SHA-256 of its predecessor's canonical
    encoding (the manifest's, for round 0): restated here, not computed by the tape's code."""
    if not view.manifest.chained:
        return ()
    tape = read_tape(view)
    out = []
    for r, rec in tape.items():
        before = view.manifest if r == 0 else tape.get(r - 1)
        if before is None:
            continue
        digest = _chain_digest(before)
        if rec.prev != digest:
            out.append(f"round {r}: prev {rec.prev}, its predecessor's digest is {digest}")
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
    "chained_tape": chained_tape,
    "learners_behind_commits": learners_behind_commits,
    "forgeries_ignored": forgeries_ignored,
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
            if store.list(keys.round_prefix(parsed.round)):
                return ()  # a record of its round (at any slot) exists
            refs = [codec.decode(Snapshot, data).payload]
        elif isinstance(parsed, keys.RoundKey):
            rec = codec.decode(RoundRecord, data)
            refs = [x for x in (rec.theta, rec.outer, rec.update) if x is not None]
    except codec.CodecError:
        return ()
    return tuple(f"{key} points at missing {ref.key}" for ref in refs if store.get(ref.key) is None)


@attrs.frozen(kw_only=True)
class Closing:
    """What a closer knew when it found its round ready to close (ghost state).

    Taken by the cluster harness from the closer's state (``entries`` and the lease
    views it holds) at the transition that set its ``quorum_at_s``. That is the
    decision; by the time its record is written, grace and the merge have passed
    and its lease views may have moved on, so the record's moment is too late to
    read what it knew.
    """

    closer: str
    round: int
    accepted: frozenset[str]
    judged: frozenset[str]
    """Accepted or rejected."""
    live: frozenset[str]
    """Learners whose lease the closer saw change within the lease timeout, and its own node's
    learner while it has not looked at that lease (protocol.md §9.4)."""
    lapsed: frozenset[str] = frozenset()
    """Learners not live whose lease the closer had seen live while the round was open."""
    garbage: frozenset[str] = frozenset()
    """Of ``judged``, the names under which only an invalid object was found: it judges
    nobody (an outsider's, or a learner's slot squatted, protocol.md §16.4)."""


def knowledge(state: closer.CloserState, now_s: float) -> Closing:
    """What ``state`` knows of its round: its verdicts, and who is live by its lease views."""
    timeout_s = state.manifest.config.lease_timeout_s
    accepted = {n for n, e in state.entries.items() if e.stage is closer.Stage.ACCEPTED}
    rejected = {n for n, e in state.entries.items() if e.stage is closer.Stage.REJECTED}
    seen = {n: v.changed_at_s for n, v in state.leases.items() if v.etag is not None}
    live = {n for n, at_s in seen.items() if now_s - at_s <= timeout_s}
    lapsed = {n for n, at_s in seen.items() if at_s + timeout_s >= state.opened_at_s} - live
    if commit._own_unknown(state):
        live.add(state.node)  # its own learner, live until its lease is looked at
    return Closing(
        closer=state.node,
        round=state.round,
        accepted=frozenset(accepted),
        judged=frozenset(accepted | rejected),
        live=frozenset(live),
        lapsed=frozenset(lapsed - accepted - rejected),
        garbage=frozenset(n for n, e in state.entries.items() if e.invalid),
    )


def closing_rule(knew: Closing, quorum: int) -> tuple[str, ...]:
    """A round closes only with ``quorum`` accepted snapshots, or with every learner the
    closer knew live already judged (and somebody known: live, judged, or lapsed while
    the round was open)."""
    if len(knew.accepted) >= quorum:
        return ()
    if (knew.live or knew.judged or knew.lapsed) and knew.live <= knew.judged:
        return ()
    waiting = sorted(knew.live - knew.judged)
    return (
        f"round {knew.round}: {knew.closer} closed with {len(knew.accepted)} accepted"
        f" (quorum {quorum}) while {waiting or 'nobody'} live and not judged",
    )


def merge_weights(store: ModelStore, merge: Merge, max_share: float | None) -> tuple[str, ...]:
    """A merge weighs each contribution tokens²/steps of the snapshot in the round's
    folder, normalized to sum to 1 (equal weights when all are 0), in learner order;
    with ``max_share``, no share is above ``max(max_share, 1)/n`` and the others keep
    their proportions (:func:`_capped_as_stated`).

    The snapshots are those ever created in the folder (the ghost history), not those in
    it now: a closer that fell behind may merge a round that another closer has since
    committed and swept (its record write then finds the key taken); it read the
    snapshots while they were there (swarm seeds 102383, 102501). Where a learner's key
    was created again after the sweep (a late write), the snapshot that carries the
    merged payload is the one read.
    """
    names = [x.learner for x in merge.contributions]
    out = [] if names == sorted(set(names)) else [f"round {merge.round}: contributors {names}"]
    snaps = []
    prefix = keys.snapshot_prefix(merge.round)
    folder = [(k, d) for k, d in store.created if k.startswith(prefix)]
    for x in merge.contributions:
        snap = _snapshot_of(folder, merge.round, x.learner, x.payload)
        if snap is None or snap.steps < 1:
            return (*out, f"round {merge.round}: merges {x.learner} without a snapshot")
        if (x.payload, x.final) != (snap.payload, snap.final):
            out.append(f"round {merge.round}: {x.learner}'s payload or final differs")
        snaps.append(snap)
    raw = [_weight(x) for x in snaps]
    total = sum(raw)
    expected = [w / total if total > 0 else 1 / len(raw) for w in raw]
    got = [x.weight for x in merge.contributions]
    if max_share is None or max_share >= len(got):
        for x, want in zip(merge.contributions, expected, strict=True):
            if abs(x.weight - want) > 1e-9:
                out.append(f"round {merge.round}: {x.learner} weighs {x.weight}, not {want}")
    else:
        out.extend(f"round {merge.round}: {m}" for m in _capped_as_stated(expected, got, max_share))
    if merge.final_only != all(x.final for x in snaps):
        out.append(f"round {merge.round}: final_only {merge.final_only}")
    return tuple(out)


def _capped_as_stated(plain: list[float], got: list[float], factor: float) -> list[str]:
    """The cap's three promises: shares sum to 1, none is above the cap, and the
    shares below it stand in the plain shares' proportions; none rises above its plain share
    unless it is below the cap (excess goes only to those under it)."""
    cap = max(factor, 1.0) / len(got)
    out = []
    if abs(sum(got) - 1.0) > 1e-9:
        out.append(f"shares sum to {sum(got)}")
    out += [f"share {g} above the cap {cap}" for g in got if g > cap + 1e-9]
    free = [(p, g) for p, g in zip(plain, got, strict=True) if g < cap - 1e-9]
    ratios = [g / p for p, g in free if p > 0]
    if ratios and max(ratios) - min(ratios) > 1e-9 * max(ratios):
        out.append(f"shares under the cap are not in proportion: {free}")
    out += [
        f"share {g} capped though its plain share is {p}"
        for p, g in zip(plain, got, strict=True)
        if g < p - 1e-9 and g < cap - 1e-9
    ]
    return out


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


# --- follow (spec/coordination.md §7): moments of the marker's write and of its use ------------


def _marker_accepted(data: bytes, round_: int) -> int | None:
    """The accepted count a ``follow`` marker body names for ``round_``, re-stated from the
    spec (canonical JSON of exactly accepted/format/round, format 1, a positive count)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"accepted", "format", "round"}:
        return None
    accepted = doc["accepted"]
    if doc["format"] != 1 or doc["round"] != round_ or type(doc["round"]) is not int:
        return None
    return accepted if type(accepted) is int and accepted >= 1 else None


def follow_marker_written(
    knew: Closing, follow: int, created: Iterable[tuple[str, bytes]], data: bytes
) -> tuple[str, ...]:
    """A closer writes round r's ``follow`` marker only with ``follow`` set, some learner it
    knows live not yet judged, and at least ``max(1, min(follow, n − 1))`` accepted learners
    (n ≥ 2: learners live or judged on its clock, an invalid object judging nobody) that each
    have a valid snapshot of r in the store; the marker names the round and a count it
    reached."""
    r, items = knew.round, tuple(created)
    known = knew.live | (knew.judged - knew.garbage)
    valid = {a for a in knew.accepted if _snapshot_of(items, r, a) is not None}
    named = _marker_accepted(data, r)
    why = []
    if follow <= 0:
        why.append(f"follow is {follow}")
    if len(known) < 2:
        why.append(f"{len(known)} learner(s) known: nobody to follow")
    elif len(valid) < max(1, min(follow, len(known) - 1)):
        why.append(f"{len(valid)} accepted with a snapshot of {len(known)} known (follow {follow})")
    if not knew.live - (knew.judged - knew.garbage):
        why.append("every live learner already judged: nobody awaits it")
    if named is None or named > len(knew.accepted):
        why.append(f"the marker names {named} accepted, {len(knew.accepted)} were")
    return tuple(f"round {r}: {knew.closer} wrote its follow marker: {w}" for w in why)


def follow_after_marker(
    node: str, round_: int, created: Iterable[tuple[str, bytes]]
) -> tuple[str, ...]:
    """A learner moves a round up (publishes it early) only once a valid ``follow`` marker of
    that round was created in the store (by the run's closer: an outsider's is not here)."""
    key = keys.follow(round_)
    if any(k == key and _marker_accepted(d, round_) is not None for k, d in created):
        return ()
    return (f"{node} publishes round {round_} early without a valid follow marker",)
