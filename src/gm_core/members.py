"""Members the run authority admits or revokes after the manifest (spec/protocol.md §16.3.3).

Theory of operation
-------------------
With per-node keys the manifest's roster names who may write what; it is fixed at the
run's creation. A run that admits volunteers, or must shut a compromised node out, needs
both without a new run: the run authority (the Ed25519 key that signed the roster) writes

* a :class:`~gm_core.records.Certificate` admitting a node (its id, roles and key), or
* a :class:`~gm_core.records.Revocation` naming a node and the round from which its word
  no longer counts,

create-once under ``members/{node}/``, at the slots of §16.4 (keyed names: an outsider
cannot name one, so it can neither squat a member's certificate nor make a reader GET its
garbage; a member holding the run key can squat a slot, which costs the authority one
slot more). Each object is tagged with the run key (its envelope) and signed by the
authority (inside the body, so the signature survives being judged by any reader of the
run); readers learn them by listing ``members/`` (the shell, :mod:`gm_shell.members`).

Rules (the pure part, here):

* **Certificates admit learners only.** Which snapshots a leading closer merges may
  differ between closers that learned a certificate at different times without anyone
  disagreeing about the tape (the record names what was merged). A closer admitted late
  would not be that harmless: a reader that has not yet learned its certificate would
  skip its record where another adopts it, and the two would follow two tapes. So
  closers stay on the manifest's roster (§16.3.3), and a certificate granting ``closer``
  is refused by name.
* **A node on the manifest's roster is not re-certified** (the manifest's entry stands),
  and the first certificate learned for a node is its entry: a later one is ignored, so
  a node's key cannot be swapped by a second certificate (a new key is a new id).
* **Revocation is by round.** An object the revoked node signs at a key of round
  ``from_round`` or later is refused (``revoked``); one at a key of no round (a lease, a
  done marker) at once. Earlier rounds stay valid: revoking must not rewrite the tape the
  nodes have adopted. Two revocations of a node: the earlier round counts.
* **Bounded.** At most :data:`MAX_LEARNED` members are learned (each GET is bounded by
  the shell), so a member who floods ``members/`` with its own slots costs readers a
  bounded amount.

What a reader cannot know is whether it has learned *everything* yet: membership
reaches nodes by their listing, not through the tape. A revocation takes effect at each
node when it learns it, which is why the authority names a round ahead of the tape
(``gm roster revoke``); for learners that window only delays their refusal, for closers
it is a window in which a slow node could adopt a revoked closer's record
(spec/protocol.md §16.3.3, §16.9).
"""

from __future__ import annotations

import attrs

from gm_core import codec, keys
from gm_core.auth import Envelope, Signing, Unauthenticated, Why, frames, other_format, verify
from gm_core.records import ROLE_CLOSER, Certificate, Member, Revocation

SLOTS = 16
"""Slots per member (the same bound as every create-once key, protocol §16.4.3)."""

MAX_LEARNED = 4096
"""The most members a reader learns from certificates (and nodes it keeps revoked)."""

_KIND = "member"
_CERTIFICATE_DOMAIN = b"gm/2 certificate"
_REVOCATION_DOMAIN = b"gm/2 revocation"

Word = Certificate | Revocation
"""What the authority says about a node."""


def certificate_message(run_id: str, member: Member) -> bytes:
    """What the authority signs to admit ``member`` to run ``run_id``."""
    return frames(
        (
            _CERTIFICATE_DOMAIN,
            run_id.encode(),
            member.node.encode(),
            ",".join(member.roles).encode(),
            member.public_key.encode(),
        )
    )


def revocation_message(run_id: str, node: str, from_round: int, reason: str) -> bytes:
    """What the authority signs to revoke ``node`` in run ``run_id`` from ``from_round``."""
    parts = (node.encode(), str(from_round).encode(), reason.encode())
    return frames((_REVOCATION_DOMAIN, run_id.encode(), *parts))


def member_key(envelope: Envelope, node: str, slot: int) -> str:
    """The key of slot ``slot`` of ``node``'s member objects (every slot has a keyed name)."""
    return keys.member(node, envelope.slot_name(_KIND, node, slot))


def member_slot(envelope: Envelope, key: keys.MemberKey) -> int | None:
    """The slot a listed member key stands for; None for a name no slot has (foreign)."""
    for slot in range(SLOTS):
        if envelope.slot_name(_KIND, key.node, slot) == key.name:
            return slot
    return None


def judge(envelope: Envelope, signing: Signing, key: str, data: bytes) -> Word | Unauthenticated:
    """The authority's word at ``key`` (a member slot), or why it is not.

    The run key's tag first (outsiders cost a MAC), then the body (a certificate or a
    revocation of the node the key names), then the authority's signature: the roster's
    authority is the only one who speaks about members. Total: no input raises.
    """
    if envelope.auth is None:
        return Unauthenticated(why=Why.UNTAGGED, detail=f"{key}: members need a run key")
    try:
        node = keys.parse(key)
    except keys.BadKey:
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=f"{key}: not a member key")
    if not isinstance(node, keys.MemberKey):
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=f"{key}: not a member key")
    body = verify(envelope.auth, envelope.run_id, key, data)
    if isinstance(body, Unauthenticated):
        return body
    other = other_format(envelope.body_format, key, body)
    if other is not None:
        return other
    word = _decode(body)
    if isinstance(word, str):
        detail = f"{key}: not a certificate or revocation: {word}"
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=detail)
    named = word.member.node if isinstance(word, Certificate) else word.node
    if named != node.node:
        detail = f"{key}: it speaks of {named}, not {node.node}"
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=detail)
    message = (
        certificate_message(envelope.run_id, word.member)
        if isinstance(word, Certificate)
        else revocation_message(envelope.run_id, word.node, word.from_round, word.reason)
    )
    authority = bytes.fromhex(signing.roster.authority)
    if not signing.verify(authority, message, bytes.fromhex(word.signature)):
        detail = f"{key}: not signed by the run's authority"
        return Unauthenticated(why=Why.BAD_SIGNATURE, detail=detail)
    return word


def _decode(body: bytes) -> Word | str:
    """A certificate or a revocation, whichever ``body`` is; else the codec's complaint."""
    try:
        return codec.decode(Certificate, body)
    except codec.CodecError as error:
        first = str(error)
    try:
        return codec.decode(Revocation, body)
    except codec.CodecError:
        return first


def learn(signing: Signing, word: Word) -> tuple[Signing, str | None]:
    """``signing`` with ``word`` in force, and what it changed for a person (None: nothing).

    A certificate that cannot count (a closer's, a node's on the manifest's roster or
    already certified, one over :data:`MAX_LEARNED`) changes nothing; its note says why.
    """
    if isinstance(word, Revocation):
        held = signing.revoked_from.get(word.node)
        if held is not None and held <= word.from_round:
            return signing, None
        if held is None and len(signing.revoked) >= MAX_LEARNED:
            return signing, f"{word.node}: not revoked, {MAX_LEARNED} revocations already held"
        revoked = tuple(r for r in signing.revoked if r[0] != word.node)
        changed = attrs.evolve(signing, revoked=(*revoked, (word.node, word.from_round)))
        why = f": {word.reason}" if word.reason else ""
        return changed, f"{word.node} revoked from round {word.from_round}{why}"
    member = word.member
    if any(m.node == member.node for m in signing.roster.members):
        return signing, None
    if any(m.node == member.node for m in signing.certified):
        return signing, None
    if ROLE_CLOSER in member.roles:
        return signing, (
            f"{member.node}: a certificate admits learners only (closers are on the "
            "manifest's roster)"
        )
    if len(signing.certified) >= MAX_LEARNED:
        return signing, f"{member.node}: not admitted, {MAX_LEARNED} members already certified"
    changed = attrs.evolve(signing, certified=(*signing.certified, member))
    return changed, f"{member.node} admitted as {'+'.join(member.roles)}"


def reseal(envelope: Envelope, signing: Signing) -> Envelope:
    """``envelope`` judging by ``signing`` (what its node has learned of the members)."""
    if envelope.auth is None:
        return envelope
    return attrs.evolve(envelope, auth=attrs.evolve(envelope.auth, signing=signing))
