"""Per-node keys in the envelope (gm_core.auth, spec/protocol.md §16.3): who may write what.

The signature scheme here is the core's stand-in (gm_core.modelkeys), which has the one
property the rules rely on: only a node signs as itself. The shell's Ed25519 is tested
against the same envelope in tests/runtime/test_node_keys.py.
"""

from __future__ import annotations

import functools
import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L, drive, random_step
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, codec, keys, modelkeys, slots, tape
from gm_core import cluster as cl
from gm_core.auth import Envelope, Unauthenticated, Why
from gm_core.check import forger
from gm_core.invariants import FORGED_TOKENS
from gm_core.records import AlgorithmConfig, Member, Roster, RoundRecord, Snapshot

RUN_KEY = bytes(range(32))
ROLES = {"a": ("learner",), "b": ("learner",), "c": ("closer",), "d": ("learner", "closer")}
ROSTER = modelkeys.roster(ROLES)
NODES = sorted(ROLES)
OUTSIDE = "e"
"""Signs with a key of its own the verifier knows, but is not on the roster."""


def envelope(node: str | None, run_id: str = "run") -> Envelope:
    signing = modelkeys.signing(ROSTER, node, also=(OUTSIDE,))
    return auth.for_run(run_id, attrs.evolve(auth.derive(RUN_KEY), signing=signing))


def key_for(kind: str, owner: str, r: int) -> str:
    return {
        "record": keys.round_record(r),
        "slot": keys.round_record(r, "0123456789abcdef"),
        "claim": keys.claim(r, 1),
        "head": keys.head(),
        "follow": keys.follow(r),
        "snapshot": keys.snapshot(r, owner),
        "snapshot_slot": keys.snapshot(r, owner, "0123456789abcdef"),
        "lease": keys.lease(owner),
        "done": keys.done(owner),
        "finished": keys.finished(),
    }[kind]


KINDS = ["record", "slot", "claim", "head", "follow", "snapshot", "snapshot_slot", "lease"]
KINDS += ["done", "finished"]


def allowed(signer: str, kind: str, owner: str) -> bool:
    """The rule of protocol §16.3.2, restated independently of gm_core.auth.may_write."""
    roles = ROLES.get(signer, ())
    if kind in ("record", "slot", "claim", "head", "follow"):
        return "closer" in roles
    if kind in ("snapshot", "snapshot_slot"):
        return "learner" in roles and owner == signer
    if kind in ("lease", "done"):
        return signer in ROLES and owner == signer
    return signer in ROLES


@given(
    signer=st.sampled_from([*NODES, OUTSIDE]),
    kind=st.sampled_from(KINDS),
    owner=st.sampled_from(NODES),
    r=st.integers(0, 10**6),
    body=st.binary(max_size=200),
)
def test_an_object_opens_exactly_when_its_signer_may_write_its_key(
    signer: str, kind: str, owner: str, r: int, body: bytes
) -> None:
    key = key_for(kind, owner, r)
    sealed = envelope(signer).seal(key, body)
    for reader in (None, *NODES):  # every reader judges it alike, whoever it is
        verdict = envelope(reader).open(key, sealed)
        if allowed(signer, kind, owner):
            assert verdict == body
        else:
            assert _why(verdict) is Why.NOT_ALLOWED
            assert isinstance(verdict, Unauthenticated)
            assert signer in verdict.detail


@given(
    signer=st.sampled_from(NODES),
    claimed=st.sampled_from(NODES),
    kind=st.sampled_from(KINDS),
    body=st.binary(max_size=200),
)
def test_a_member_cannot_sign_as_another(signer: str, claimed: str, kind: str, body: bytes) -> None:
    """A member with the run key (so its tag verifies) writes ``claimed``'s id in the
    header over its own signature: refused, whatever ``claimed`` may write."""
    key = key_for(kind, claimed, 7)
    sealed = envelope(signer).seal(key, body)
    header, rest = sealed.split(b"\n", 1)
    fields = header.split(b" ")
    fields[4] = claimed.encode()
    forged = b" ".join(fields) + b"\n" + rest
    verdict = envelope(None).open(key, forged)
    if claimed == signer or not allowed(claimed, kind, claimed):
        return  # the same object, or refused for the role before the signature
    assert _why(verdict) is Why.BAD_SIGNATURE


@given(kind=st.sampled_from(KINDS), owner=st.sampled_from(NODES), body=st.binary(max_size=200))
def test_an_unsigned_object_with_a_good_tag_is_refused(kind: str, owner: str, body: bytes) -> None:
    key = key_for(kind, owner, 3)
    tagged_only = auth.for_run("run", auth.derive(RUN_KEY)).seal(key, body)
    assert _why(envelope(owner).open(key, tagged_only)) is Why.BAD_SIGNATURE
    # ...and a reader without per-node keys reads a signed object by its tag alone.
    assert auth.for_run("run", auth.derive(RUN_KEY)).open(key, envelope(owner).seal(key, body)) == (
        body
    )


@given(body=st.binary(max_size=100), data=st.data())
def test_any_changed_byte_of_a_signed_object_is_refused(body: bytes, data: st.DataObject) -> None:
    key = keys.snapshot(5, "a")
    sealed = bytearray(envelope("a").seal(key, body))
    at = data.draw(st.integers(0, len(sealed) - 1))
    sealed[at] ^= data.draw(st.integers(1, 255))
    assert isinstance(envelope("c").open(key, bytes(sealed)), Unauthenticated)


@given(data=st.binary(max_size=700), kind=st.sampled_from(KINDS))
def test_no_input_makes_a_signing_envelope_raise(data: bytes, kind: str) -> None:
    assert isinstance(envelope("a").open(key_for(kind, "a", 1), data), Unauthenticated)


def test_a_signature_is_bound_to_its_run_and_key() -> None:
    key = keys.snapshot(5, "a")
    sealed = envelope("a", "run").seal(key, b"{}")
    # Same run key and roster, another run id: the tag fails first.
    assert _why(envelope("c", "other").open(key, sealed)) is Why.BAD_TAG
    message = auth.signed_message("run", key, b"{}")
    assert message != auth.signed_message("run", keys.snapshot(6, "a"), b"{}")
    assert message != auth.signed_message("runx", key, b"{}")


def test_the_manifest_is_sealed_and_opened_without_signatures() -> None:
    signed = attrs.evolve(auth.derive(RUN_KEY), signing=modelkeys.signing(ROSTER, "d"))
    sealed = auth.for_manifest(signed).seal(keys.manifest(), b"{}")
    assert sealed.split(b"\n", 1)[0].count(b" ") == 3  # marker, alg, key id, tag
    assert auth.for_manifest(signed).open(keys.manifest(), sealed) == b"{}"
    assert auth.for_manifest(auth.derive(RUN_KEY)).open(keys.manifest(), sealed) == b"{}"


def test_the_roster_codec_names_what_is_wrong() -> None:
    assert codec.decode(Roster, codec.encode(ROSTER)) == ROSTER
    member = ROSTER.members[0]
    bad = {
        "members[0].roles[0]": attrs.evolve(member, roles=("admin",)),
        "members[0].roles": attrs.evolve(member, roles=()),
        "members[0].public_key": attrs.evolve(member, public_key="AB" * 32),
        "members[0].node": attrs.evolve(member, node="../x"),
    }
    for path, changed in bad.items():
        roster = attrs.evolve(ROSTER, members=(changed, *ROSTER.members[1:]))
        with pytest.raises(codec.CodecError) as refused:
            codec.encode(roster)
        assert refused.value.path == path
    with pytest.raises(codec.CodecError) as refused:
        codec.encode(attrs.evolve(ROSTER, members=(member, member)))
    assert refused.value.path == "members[1].node"
    assert isinstance(Member(node="x", roles=("closer",), public_key="0" * 64), Member)


def test_the_model_roster_carries_its_authoritys_signature() -> None:
    verify = modelkeys.verifier([])
    authority = bytes.fromhex(ROSTER.authority)
    signature = bytes.fromhex(ROSTER.signature)
    assert verify(authority, auth.roster_message(ROSTER), signature)
    dropped = attrs.evolve(ROSTER, members=ROSTER.members[1:])
    assert not verify(authority, auth.roster_message(dropped), signature)


def _why(verdict: bytes | Unauthenticated) -> Why | None:
    return verdict.why if isinstance(verdict, Unauthenticated) else None


# --- a model cluster with per-node keys and a member forger ------------------------------

CLUSTER_ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
CLUSTER_CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1, in_flight=2)


def member_run() -> cl.Cluster:
    c = cl.create(
        CLUSTER_CONFIG,
        CLUSTER_ROLES,
        learner_options=FAST_L,
        closer_options=FAST_C,
        run_key=RUN_KEY,
        members={forger.EVIL: ("learner",)},
    )
    for name in sorted(CLUSTER_ROLES):
        c = cl.start(c, name)
    return c


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), before=st.integers(30, 300))
def test_a_member_forging_a_commit_and_a_snapshot_as_another_changes_nothing(
    seed: int, before: int
) -> None:
    """``evil`` is on the roster as a learner, holds the run key and its own key: its
    chained commit and its snapshot in n2's name carry a valid tag and a valid signature,
    its own, and are refused (``not_allowed``); the run commits on, every record is a
    closer's, nothing it forged is merged, every invariant holds."""
    rng = random.Random(seed)
    c = member_run()
    for _ in range(before):
        c = random_step(c, rng, sorted(CLUSTER_ROLES))
    for kind in (forger.Forgery.RECORD, forger.Forgery.SNAPSHOT):
        if forger.possible(c, kind):
            c = forger.forge(c, kind)
    committed = len(cl.records(c))
    for _ in range(600):
        c = random_step(c, rng, sorted(CLUSTER_ROLES))
    assert cl.check(c) == []
    assert all(record.closer in {"n0", "n1"} for record in cl.records(c))
    assert all(
        p.tokens != FORGED_TOKENS and p.learner in CLUSTER_ROLES
        for record in cl.records(c)
        for p in record.participants
    )
    assert len(cl.records(c)) > committed
    refused = [n.detail for _, n in c.notes if "not_allowed" in n.detail]
    if read_by_someone(c):
        assert refused, "a forgery landed where a node read it, and nobody named it"


def read_by_someone(c: cl.Cluster) -> bool:
    """Whether a node had to read a forgery: a record's slot 0 of a round that got a record
    (its closer wrote there or probed it), or the victim's snapshot key of a round it
    published. A snapshot forged for a round its victim skipped, and closed before the
    leader listed it, is read by nobody (seed 156, before 116: round 0, n2 not yet there)."""
    rounds = {r.round for r in cl.records(c)}
    published = {n.round for node, n in c.notes if node == "n2" and n.kind == "published"}
    for key in c.hostile:
        parsed = keys.parse(key)
        if isinstance(parsed, keys.RoundKey) and parsed.round in rounds:
            return True
        if isinstance(parsed, keys.SnapshotKey) and parsed.round in published:
            return True
    return False


@functools.cache
def a_record() -> RoundRecord:
    """A real record of the member run (its content is a correct closer's)."""
    rng = random.Random(3)
    c = member_run()
    while not cl.records(c):
        c = random_step(c, rng, sorted(CLUSTER_ROLES))
    return cl.records(c)[0]


@given(signer=st.sampled_from(["c", "d"]), named=st.sampled_from(["c", "d"]))
def test_a_closer_cannot_write_a_record_in_another_closers_name(signer: str, named: str) -> None:
    """Both may write records; each only as itself: a record whose ``closer`` is not its
    signer is refused (``not_allowed``), so the tape's accounting of who closed each round
    (G5) holds against a closer's key too. The same rule judges a claim's ``node``."""
    record = attrs.evolve(a_record(), closer=named)
    key = tape.record_key(envelope(None), record.round, 0)
    data = envelope(signer).seal(key, codec.encode(record))
    parsed = tape.parse_record(envelope(None), data, record.round, CLUSTER_CONFIG)
    if signer == named:
        assert parsed == record
        assert envelope(None).not_signed_by(data, named) is None
    else:
        assert isinstance(parsed, tape.BadRecord)
        assert "not_allowed" in parsed.reason
        assert f"signed by {signer}" in parsed.reason
    without = auth.for_run("run", auth.derive(RUN_KEY))  # the run key alone: nobody to check
    assert without.not_signed_by(data, "anyone") is None


def as_member(c: cl.Cluster, key: str, body: bytes) -> bytes:
    """``body`` at ``key`` tagged with the run key and signed by the member ``evil``."""
    assert c.run_auth is not None
    assert c.run_auth.signing is not None
    evil = modelkeys.signing(c.run_auth.signing.roster, forger.EVIL)
    run = auth.for_run(c.manifest.run_id, attrs.evolve(c.run_auth, signing=evil))
    return run.seal(key, body)


@pytest.mark.parametrize("seed", [2, 11])
def test_a_member_squatting_a_learners_slot_0_costs_it_nothing(seed: int) -> None:
    """``evil`` (a member) writes, at n2's slot 0 of each of the next 12 rounds, a snapshot in
    n2's name, tagged and signed as itself: the slot is skipped (``not_allowed``), n2 writes
    its slot 1 and is merged from it. Skipping a slot is not a verdict on the learner: no
    ``rejected`` event names n2 in a round that merged it (only a round that closed before
    its next slot was read may still name it)."""
    rng = random.Random(seed)
    c = member_run()
    while not cl.records(c):
        c = random_step(c, rng, sorted(CLUSTER_ROLES))
    first = cl.records(c)[-1].round + 1
    rounds = range(first, first + 12)
    for r in rounds:
        key = keys.snapshot(r, "n2")
        fragment = r % CLUSTER_CONFIG.fragments
        forged = attrs.evolve(a_snapshot(c), round=r, fragment=fragment)
        c = cl.inject(c, key, as_member(c, key, codec.encode(forged)))
    while cl.records(c)[-1].round < rounds[-1] + CLUSTER_CONFIG.fragments:
        c = drive(c, 1, rng)
    assert cl.check(c) == []
    squatted = {r for r in rounds if keys.snapshot(r, "n2") in c.hostile}
    by_round = {r.round: r for r in cl.records(c) if r.round in squatted}
    merged = {r for r, rec in by_round.items() if "n2" in {p.learner for p in rec.participants}}
    assert merged, squatted
    created = {key for key, _ in c.store.created}
    run = auth.for_run(c.manifest.run_id, c.run_auth)
    assert {slots.snapshot_key(run, r, "n2", 1) for r in merged} <= created
    skipped = [n for _, n in c.notes if n.kind == "snapshot_unauthenticated" and n.round in merged]
    assert skipped
    assert all("not_allowed" in n.detail for n in skipped)
    # What the closer of each round said of n2 is what its record says: a skipped slot
    # alone is no verdict (it is one only if the round closed before n2's next slot).
    said = {
        (n.round, n.detail)
        for node, n in c.notes
        if n.kind == "rejected"
        and n.detail.startswith("n2:")
        and n.round in by_round
        and node == by_round[n.round].closer
    }
    recorded = {
        (r, f"n2: {j.reason}")
        for r, record in by_round.items()
        for j in record.rejections
        if j.learner == "n2"
    }
    assert said == recorded


def a_snapshot(c: cl.Cluster) -> Snapshot:
    """A snapshot in n2's name as a member can write one (its payload a real commit's)."""
    newest = cl.records(c)[-1]
    return Snapshot(
        learner="n2",
        round=newest.round + 1,
        fragment=0,
        base_version=newest.frontier[0].version,
        steps=CLUSTER_CONFIG.sync_every,
        tokens=FORGED_TOKENS,
        step_s=0.1,
        schema_digest=c.schema_digest,
        payload=newest.frontier[0].theta,
    )


@pytest.mark.parametrize("seed", [1, 4])
def test_a_member_claim_at_the_next_takeovers_key_costs_one_bid(seed: int) -> None:
    """The next closer crashes; ``evil`` (a member, role learner) has written the claim a
    follower bids first (attempt 1, its keyed name: a member can compute it), signed as
    itself. The follower's bid finds it taken, reads it, refuses it (``not_allowed``: only
    closers claim) and bids attempt 2: the run is taken over and goes on."""
    rng = random.Random(seed)
    c = member_run()
    while len(cl.records(c)) < 2:
        c = drive(c, 1, rng)
    crashed = cl.records(c)[-1].next_closer
    c = cl.crash(c, crashed)
    assert forger.possible(c, forger.Forgery.CLAIM)
    c = forger.forge(c, forger.Forgery.CLAIM)
    taken = cl.records(c)[-1].round + 1
    hung = frozenset({crashed})
    for _ in range(400):
        if len(cl.records(c)) > taken + 2:
            break
        c = drive(c, 1, rng, hung=hung)
    assert cl.check(c) == []
    record = {r.round: r for r in cl.records(c)}[taken]
    assert record.closer != crashed
    assert record.claim >= 2  # attempt 1 is the member's, refused
    refused = [n.detail for _, n in c.notes if n.kind == "claim_rejected" and n.round == taken]
    assert any("not_allowed" in d and "claim 1" in d for d in refused), refused
