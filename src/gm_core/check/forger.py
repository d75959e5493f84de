"""The forger: an actor with write access to the bucket but without the run key.

Theory of operation
-------------------
The checker's other actors are the run's own nodes and the store's faults. The
forger writes, at any moment the search chooses, one codec-valid object of a
kind the bound set allows, at the key the run reads next: a snapshot of a
learner that never joined (``evil``) claiming a large share of the round, a
round record for the next round that merges it, or the claim a follower bids
first for the open round (attempt 1) naming ``evil``. It writes as an outsider can:
bare in an open run, and in an authenticated run with the run's key id (which
is public) and a tag it had to make up. Each kind is written at most once per
path, so the search covers every moment at which it can land.

A bound set with ``revoked`` too makes it a member the run authority revoked from round
0, which every node knows: its snapshot is its own, at its own key, in its own name and
signed as itself — everything a learner may write — and only the revocation refuses it
(planted bug ``skip-revocation-check``).

A bound set with ``member`` makes the forger a *member* of a run with per-node keys
(spec/protocol.md §16.3): ``evil`` is on the roster as a learner and holds the run key
and its own key (gm_core.modelkeys' stand-in), so its objects carry a valid tag and a
valid signature, its own. It can then write what a run key alone cannot refuse: its
record is refused only because a learner may not write records, and its snapshot, in
the last learner's name at that learner's key, only because a learner may publish
only as itself (both ``not_allowed``); its claim (a member can compute the keyed
name of attempt 1) only because a learner may not claim. Every forged snapshot claims
:data:`gm_core.invariants.FORGED_TOKENS`, which is how the invariant tells a merged
forgery from the victim's own snapshot.

What the checker then judges is the invariant ``forgeries_ignored``
(:func:`gm_core.invariants.forgeries_ignored`): no record of the run merges a
learner outside the cluster, and no node holds a record the run's own closers
did not write. In an authenticated run that holds whatever the forger does; the
planted bug "skip tag verification" (:mod:`gm_core.check.plants`) shows the
checker sees it broken. In an open run it does not hold, which is what
spec/threat-model.md says of open runs.
"""

from __future__ import annotations

import enum

import attrs

from gm_core import auth, cluster, codec, election, invariants, keys, modelkeys, schedule, tape
from gm_core.records import (
    AlgorithmConfig,
    Claim,
    FragmentState,
    Participant,
    RoundRecord,
    Snapshot,
)

EVIL = "evil"
"""The learner id the forger writes as (never a node of a checked cluster)."""

FORGER_KEY = bytes(range(32))
"""The run key of an authenticated bound set (the forger does not hold it)."""

_MADE_UP_TAG = b"ab" * 32


class Forgery(enum.StrEnum):
    SNAPSHOT = "snapshot"
    RECORD = "record"
    CLAIM = "claim"


def forged_kinds(c: cluster.Cluster) -> frozenset[Forgery]:
    """The kinds the forger has written on this path (each is written once)."""
    kinds = set()
    for key in c.hostile:
        parsed = keys.parse(key)
        if isinstance(parsed, keys.SnapshotKey):
            kinds.add(Forgery.SNAPSHOT)
        elif isinstance(parsed, keys.RoundKey):
            kinds.add(Forgery.RECORD)
        elif isinstance(parsed, keys.ClaimKey):
            kinds.add(Forgery.CLAIM)
    return frozenset(kinds)


def possible(c: cluster.Cluster, kind: Forgery) -> bool:
    """Whether ``kind`` can be forged now: not yet on this path, and its key is free."""
    if kind in forged_kinds(c):
        return False
    forged = _object(c, kind)
    return forged is not None and c.store.get(forged[0]) is None


def forge(c: cluster.Cluster, kind: Forgery) -> cluster.Cluster:
    """The cluster after the forger writes its ``kind`` object at the key read next."""
    forged = _object(c, kind)
    if forged is None:
        raise ValueError(f"{kind} cannot be forged before the first record")
    key, body = forged
    return cluster.inject(c, key, _sealed(c, key, body))


def forged_record(c: cluster.Cluster) -> tuple[str, bytes] | None:
    """A plausible record for the next round merging ``evil``, at the round's slot 0, bare
    (None before the first record: a plausible forgery copies a real record's shape)."""
    return _object(c, Forgery.RECORD)


def _object(c: cluster.Cluster, kind: Forgery) -> tuple[str, bytes] | None:
    """The key the run reads next for ``kind``, and the forged body for it."""
    records = cluster.records(c)
    newest = records[-1] if records else None
    round_ = newest.round + 1 if newest is not None else 0
    config = c.manifest.config
    fragment = schedule.fragment_of(round_, config.fragments)
    frontier = newest.frontier if newest is not None else c.manifest.init
    if kind is Forgery.SNAPSHOT:
        learner = _victim(c) if _member(c) and not _revoked(c) else EVIL
        snapshot = Snapshot(
            learner=learner,
            round=round_,
            fragment=fragment,
            base_version=frontier[fragment].version,
            steps=config.sync_every,
            tokens=invariants.FORGED_TOKENS,
            step_s=0.1,
            schema_digest=c.schema_digest,
            payload=frontier[fragment].theta,
        )
        return keys.snapshot(round_, learner), codec.encode(snapshot)
    if kind is Forgery.CLAIM:
        # Attempt 1 of the open round: the first bid a follower makes. A member computes its
        # keyed name; an outsider writes the numbered key (all an authenticated run's
        # readers never read: its names are keyed, spec/protocol.md §16.4.4).
        key = (
            election.claim_key(auth.for_run(c.manifest.run_id, c.run_auth), round_, 1)
            if _member(c)
            else keys.claim(round_, 1)
        )
        return key, codec.encode(Claim(round=round_, attempt=1, node=EVIL))
    if newest is None:
        return None  # a plausible forged record copies a real one's shape
    evil = Participant(learner=EVIL, steps=1, tokens=1, weight=1.0, base_version=0, final=False)
    state = frontier[fragment]
    record = attrs.evolve(
        next_commit(newest, round_, attrs.evolve(state, version=state.version + 1), config),
        closer=EVIL,
        claim=1,
        participants=(evil,),
        rejections=(),
        prev=_prev(c, newest),
    )
    return keys.round_record(round_), codec.encode(record)


def next_commit(
    newest: RoundRecord, round_: int, state: FragmentState, config: AlgorithmConfig
) -> RoundRecord:
    """``newest`` carried to ``round_``, committing ``state`` as that round's fragment: the
    shape of a plausible forged commit (a test's forger uses it too)."""
    fragment = schedule.fragment_of(round_, config.fragments)
    return attrs.evolve(
        newest,
        round=round_,
        step=schedule.step_of(round_, config.sync_every, config.fragments),
        fragment=fragment,
        version=state.version,
        theta=state.theta,
        frontier=tuple(state if f == fragment else s for f, s in enumerate(newest.frontier)),
    )


def _member(c: cluster.Cluster) -> bool:
    """Whether the forger is a member (the run has per-node keys, and it is on the roster)."""
    return c.run_auth is not None and c.run_auth.signing is not None


def _revoked(c: cluster.Cluster) -> bool:
    """Whether the forger is a revoked member: it then writes its own snapshot in its own
    name, which nothing but the revocation refuses (spec/protocol.md §16.3.3)."""
    signing = None if c.run_auth is None else c.run_auth.signing
    return signing is not None and EVIL in signing.revoked_from


def _victim(c: cluster.Cluster) -> str:
    """Whose name a member forges a snapshot in: the last node that learns (a learner-only
    node where the bound set has one)."""
    return max(n for n, machines in c.roles.items() if cluster.Machine.LEARNER in machines)


def _prev(c: cluster.Cluster, newest: RoundRecord) -> str | None:
    """What the forged record names as its predecessor: the newest record's digest, as a
    forger who reads the tape computes it, when the forger is a member (its record must
    chain to be a commit nodes would adopt but for its signer). An outsider's keeps the
    newest record's own ``prev``, as in the bound sets pinned before per-node keys: its
    tag fails first either way."""
    if not _member(c):
        return newest.prev
    return tape.chain_digest(newest)


def _sealed(c: cluster.Cluster, key: str, body: bytes) -> bytes:
    """``body`` as the forger can write it: an outsider bare, or with the public key id and a
    made-up tag; a member (per-node keys) tagged with the run key and signed as itself."""
    if c.run_auth is None:
        return body
    if c.run_auth.signing is not None:
        member = modelkeys.signing(c.run_auth.signing.roster, EVIL)
        return auth.of_run(c.manifest, attrs.evolve(c.run_auth, signing=member)).seal(key, body)
    key_id = c.run_auth.key_id.encode()
    return b"%s%s %s %s\n%s" % (auth.MARKER, auth.ALG.encode(), key_id, _MADE_UP_TAG, body)


def is_forged(record: RoundRecord) -> bool:
    """Whether a record merges the forger's learner (what no correct closer writes)."""
    return any(p.learner == EVIL for p in record.participants)
