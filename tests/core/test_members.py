"""Members admitted and revoked after the manifest (gm_core.members, spec/protocol.md §16.3.3).

With gm_core's stand-in signature scheme (gm_core.modelkeys): the authority's word opens
exactly when the authority signed it for this run and this member's key, whatever bytes
sit there; what a reader learns admits learners only and never swaps a member's key; and
once a node is revoked from round ``r0``, an object it signs opens exactly at keys of
rounds before ``r0``. The shell's Ed25519 and its reads are tested in
tests/runtime/test_members.py.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, codec, keys, members, modelkeys
from gm_core.auth import Envelope, Signing, Unauthenticated, Why
from gm_core.records import Certificate, Member, Revocation

RUN_KEY = bytes(range(32))
RUN = "run"
ROSTER = modelkeys.roster({"c": ("learner", "closer"), "a": ("learner",)})
NEW = ("v", "w")
"""Nodes off the manifest's roster that the authority may admit (the verifier knows them)."""
ROUND_KEYS = ("snapshot", "snapshot_slot")
UNROUNDED = ("lease", "done")


def signing(node: str | None = None) -> Signing:
    return modelkeys.signing(ROSTER, node, also=NEW)


def envelope(node: str | None = None, run_id: str = RUN) -> Envelope:
    return auth.for_run(run_id, attrs.evolve(auth.derive(RUN_KEY), signing=signing(node)))


def member(node: str, roles: tuple[str, ...] = ("learner",), key_of: str | None = None) -> Member:
    return Member(node=node, roles=roles, public_key=modelkeys.public_key(key_of or node))


def certificate(m: Member, run_id: str = RUN, by: str = modelkeys.AUTHORITY) -> Certificate:
    signature = modelkeys.sign_as(by)(members.certificate_message(run_id, m)).hex()
    return Certificate(member=m, signature=signature)


def revocation(
    node: str, since: int, reason: str = "", by: str = modelkeys.AUTHORITY
) -> Revocation:
    message = members.revocation_message(RUN, node, since, reason)
    signature = modelkeys.sign_as(by)(message).hex()
    return Revocation(node=node, from_round=since, reason=reason, signature=signature)


def stored(word: members.Word, slot: int = 0, run_id: str = RUN) -> tuple[str, bytes]:
    """The key and bytes of ``word`` as the authority writes it (tagged, not node-signed)."""
    writer = envelope(None, run_id)
    node = word.member.node if isinstance(word, Certificate) else word.node
    key = members.member_key(writer, node, slot)
    return key, writer.pack(key, word)


def key_for(kind: str, owner: str, r: int) -> str:
    return {
        "snapshot": keys.snapshot(r, owner),
        "snapshot_slot": keys.snapshot(r, owner, "0123456789abcdef"),
        "lease": keys.lease(owner),
        "done": keys.done(owner),
    }[kind]


def learned(*words: members.Word) -> Signing:
    s = signing()
    for word in words:
        s, _ = members.learn(s, word)
    return s


# --- the authority's word -----------------------------------------------------------


@given(
    node=st.sampled_from(NEW),
    slot=st.integers(0, members.SLOTS - 1),
    by=st.sampled_from([modelkeys.AUTHORITY, "c", "v"]),
    run_id=st.sampled_from([RUN, "other"]),
    revoke=st.booleans(),
)
def test_the_word_opens_exactly_when_the_authority_said_it_for_this_run(
    node: str, slot: int, by: str, run_id: str, revoke: bool
) -> None:
    word: members.Word = revocation(node, 3, by=by) if revoke else certificate(member(node), by=by)
    if run_id != RUN:  # signed for another run, stored (and tagged) in this one
        if revoke:
            word = attrs.evolve(
                word,
                signature=modelkeys.sign_as(by)(
                    members.revocation_message(run_id, node, 3, "")
                ).hex(),
            )
        else:
            word = certificate(member(node), run_id=run_id, by=by)
    key, data = stored(word, slot)
    got = members.judge(envelope(), signing(), key, data)
    if by == modelkeys.AUTHORITY and run_id == RUN:
        assert got == word
    else:
        assert isinstance(got, Unauthenticated)
        assert got.why is Why.BAD_SIGNATURE


@given(data=st.binary(max_size=300), flip=st.integers(0, 10_000), node=st.sampled_from(NEW))
def test_judging_never_raises_and_any_changed_byte_is_refused(
    data: bytes, flip: int, node: str
) -> None:
    key, good = stored(certificate(member(node)))
    assert isinstance(
        members.judge(envelope(), signing(), key, data), Unauthenticated | Certificate
    )
    at = flip % len(good)
    changed = good[:at] + bytes([good[at] ^ 0x01]) + good[at + 1 :]
    assert isinstance(members.judge(envelope(), signing(), key, changed), Unauthenticated)


def test_a_word_at_another_members_key_or_without_the_run_key_is_refused() -> None:
    writer = envelope()
    word = certificate(member("v"))
    key = members.member_key(writer, "w", 0)  # v's certificate at w's slot
    assert members.judge(writer, signing(), key, writer.pack(key, word)).why is Why.NOT_ALLOWED  # type: ignore[union-attr]
    other = auth.for_run(RUN, attrs.evolve(auth.derive(bytes(32)), signing=signing()))
    key = members.member_key(writer, "v", 0)
    assert members.judge(writer, signing(), key, other.pack(key, word)).why is Why.WRONG_KEY  # type: ignore[union-attr]
    assert members.judge(writer, signing(), key, codec.encode(word)).why is Why.UNTAGGED  # type: ignore[union-attr]


def test_slot_names_are_keyed_and_only_the_runs_nodes_find_them() -> None:
    ours, theirs = envelope(), auth.for_run(RUN, auth.derive(bytes(32)))
    names = {members.member_key(ours, "v", s) for s in range(members.SLOTS)}
    assert len(names) == members.SLOTS
    for s in range(members.SLOTS):
        parsed = keys.parse(members.member_key(ours, "v", s))
        assert isinstance(parsed, keys.MemberKey)
        assert members.member_slot(ours, parsed) == s
        assert members.member_slot(theirs, parsed) is None
    assert (
        keys.build(keys.parse("members/v/0123456789abcdef.json"))
        == "members/v/0123456789abcdef.json"
    )
    for bad in ("members/v.json", "members/../x/0123456789abcdef.json", "members/v/ABC.json"):
        with pytest.raises(keys.BadKey):
            keys.parse(bad)


# --- learning -------------------------------------------------------------------------


def test_certificates_admit_learners_only_and_never_swap_a_members_key() -> None:
    s = learned(certificate(member("v")))
    assert s.members["v"] == member("v")
    assert s.members["c"] == next(m for m in ROSTER.members if m.node == "c")
    for word in (
        certificate(member("w", ("learner", "closer"))),  # a closer
        certificate(member("c", key_of="v")),  # on the manifest's roster
        certificate(member("v", key_of="w")),  # a second certificate
    ):
        again, note = members.learn(s, word)
        assert again is s
        assert word.member.node != "w" or "learners only" in (note or "")
    assert "w" not in s.members
    assert s.members["v"].public_key == modelkeys.public_key("v")


@given(
    since=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    r=st.integers(0, 60),
    kind=st.sampled_from(ROUND_KEYS + UNROUNDED),
    who=st.sampled_from(["a", "v"]),
)
@settings(max_examples=200)
def test_a_revoked_members_word_counts_exactly_before_its_revocations_round(
    since: list[int], r: int, kind: str, who: str
) -> None:
    """Revoked (by one or more revocations), ``who``'s object at ``kind``'s key of round
    ``r`` opens iff the key has a round and it is before the earliest revocation's; the
    other members are untouched."""
    s = learned(certificate(member("v")), *(revocation(who, x) for x in since))
    writer = members.reseal(envelope(who), attrs.evolve(s, node=who, sign=modelkeys.sign_as(who)))
    reader = members.reseal(envelope(), s)
    key = key_for(kind, who, r)
    got = reader.open(key, writer.seal(key, b"{}"))
    if kind in ROUND_KEYS and r < min(since):
        assert got == b"{}"
    else:
        assert isinstance(got, Unauthenticated)
        assert got.why is Why.REVOKED
        assert f"{who} is revoked from round {min(since)}" in got.detail
    other = "v" if who == "a" else "a"
    writer = members.reseal(
        envelope(other), attrs.evolve(s, node=other, sign=modelkeys.sign_as(other))
    )
    key = key_for(kind, other, r)
    assert reader.open(key, writer.seal(key, b"{}")) == b"{}"


def test_a_reader_that_has_not_learned_a_certificate_refuses_its_members_objects() -> None:
    s = learned(certificate(member("v")))
    writer = members.reseal(envelope("v"), attrs.evolve(s, node="v", sign=modelkeys.sign_as("v")))
    key = keys.snapshot(4, "v")
    data = writer.seal(key, b"{}")
    assert members.reseal(envelope(), s).open(key, data) == b"{}"
    refused = envelope().open(key, data)
    assert isinstance(refused, Unauthenticated)
    assert refused.why is Why.NOT_ALLOWED


def test_learning_is_bounded() -> None:
    s = signing()
    for i in range(members.MAX_LEARNED + 3):
        node = f"n{i}"
        s, _ = members.learn(
            s,
            Certificate(
                member=Member(node=node, roles=("learner",), public_key="0" * 64),
                signature="0" * 128,
            ),
        )
        s, _ = members.learn(s, Revocation(node=node, from_round=1, reason="", signature="0" * 128))
    assert len(s.certified) == members.MAX_LEARNED
    assert len(s.revoked) == members.MAX_LEARNED


def test_planted_no_revocation_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planting "skip the revocation check" fails the revocation property."""
    monkeypatch.setattr(auth, "_revoked", lambda signing, signer, key: None)
    with pytest.raises(AssertionError):
        test_a_revoked_members_word_counts_exactly_before_its_revocations_round()
