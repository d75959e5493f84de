"""Authenticated runs: the run key, the envelope every JSON object wears, and its verdicts.

Theory of operation
-------------------
The bucket is gm's only channel and anyone with write access to it can put bytes at
any key (spec/threat-model.md). A run key ``K`` (32 random bytes, shared by the run's
nodes out of band, never written to the bucket) lets a node tell the run's own objects
from everyone else's: every JSON object (manifest, head, record, snapshot, claim,
lease) is stored as one ASCII header line and the body (spec/protocol.md §16.2)::

    gm/2 hmac-sha256 <key_id> <tag>\\n<canonical JSON body>

``tag`` is HMAC-SHA256 under a subkey of ``K`` over a domain string, the run id, the
object's key (relative to the run prefix) and the exact body bytes, each framed by its
length, so an authentic object is authentic only at its own key in its own run: a
snapshot of round 5 replayed at round 6's key, under another learner or into another
run that shares the key fails. Tag first, parse second: :meth:`Envelope.open` checks the
tag over the stored bytes before any parser sees them.

Payloads are not enveloped: records and snapshots name them by digest, and in an
authenticated run that digest is keyed (:attr:`RunAuth.payload_key`, BLAKE3 in keyed
mode, computed by the shell), so nobody without the key can produce bytes a record's
digest accepts, nor predict the name a closer is about to write.

An *open* run (no key) writes the bodies bare, exactly as format 1 did; it has no
defence against a deliberate writer (spec/threat-model.md §3), only against accidents.
The mode is the node's configuration, never the bucket's word: a keyed node accepts
only objects tagged under its key, and an open node refuses tagged ones, so writing
untagged objects cannot downgrade a run.

Per-node keys (spec/protocol.md §16.3, optional on top of the run key). A run whose
manifest carries a :class:`~gm_core.records.Roster` also needs every object signed by
its writer: the header gains ``<signer> <signature>`` (Ed25519 over the same framed
input as the tag, under the domain ``gm/2 signature``), and an object is the run's
only when the signer is a member allowed to write its key (:func:`may_write`: only
closers write records, claims, the head and follow markers; a learner writes only its
own snapshots; every node only its own lease and done marker). The MAC comes first, so
an outsider's object costs microseconds before any signature check. gm_core stays
pure: the signature scheme is a pair of functions the shell passes in
(:class:`Signing`; Ed25519 from ``cryptography`` in gm_shell.nodekeys), deterministic,
so transitions stay functions of their inputs. The manifest itself is not signed: the
roster is inside it (its integrity is the run key's tag, its authority's signature
checked by the shell, and a pinnable digest).

Why HMAC-SHA256 for the tags: it is in Python's standard library (gm_core's dependency
set stays attrs, cattrs, numpy), and the objects it covers are at most
:data:`gm_core.codec.MAX_RECORD_BYTES`, where a tag costs microseconds either way
(bench/bench_auth.py measures it against keyed and unkeyed BLAKE3). Subkeys are
HMAC-SHA256 of ``K`` over a fixed context per purpose, so a value computed for one
purpose is never valid for another.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
from collections.abc import Callable, Mapping

import attrs

from gm_core import codec, keys
from gm_core.records import (
    AUTH_ALG,
    FORMAT_2,
    FORMATS,
    ROLE_CLOSER,
    ROLE_LEARNER,
    AuthInfo,
    Manifest,
    Member,
    Roster,
)

KEY_BYTES = 32
"""A run key is this many random bytes (64 hex characters in ``GM_RUN_KEY``)."""

ALG = AUTH_ALG
"""The tag algorithm this code writes and reads."""

ENVELOPE_VERSION = 2
MARKER = b"gm/2 "
"""How a tagged object begins; a format-1 object (and an open run's) begins with ``{``."""
_FAMILY = b"gm/"
"""How every envelope version begins (``gm/N ``, spec/protocol.md §16.7)."""
_VERSION_DIGITS = 4

HEADER_MAX_BYTES = 512
"""The longest header line a reader looks at (an object with a longer one is refused)."""

KEY_ID_CHARS = 16
TAG_CHARS = 64
SIGNATURE_CHARS = 128
"""An Ed25519 signature, as hex in the header."""
PUBLIC_KEY_BYTES = 32

_TAG_CONTEXT = b"gm/2 2026 object tag"
_PAYLOAD_CONTEXT = b"gm/2 2026 payload digest"
_KEY_ID_CONTEXT = b"gm/2 2026 key id"
_NAME_CONTEXT = b"gm/2 2026 slot name"
_RESUME_CONTEXT = b"gm/2 2026 resume digest"
_DOMAIN = b"gm/2 object"
_SLOT_DOMAIN = b"gm/2 slot"
_SIGNATURE_DOMAIN = b"gm/2 signature"
_ROSTER_DOMAIN = b"gm/2 roster"
_OPEN_NAME_KEY = b"gm/2 open run: slot names are public"
"""An open run's slot names use this public key: the same code, no secret."""
SLOT_NAME_CHARS = 16
_HEX_DIGITS = "0123456789abcdef"
_HEX = frozenset(_HEX_DIGITS.encode())


class Why(enum.StrEnum):
    """Why an object is not the run's (spec/protocol.md §16.2.5)."""

    UNTAGGED = "untagged"
    """No header in a keyed run: a format-1 or open-run object, or garbage."""
    MALFORMED_HEADER = "malformed_header"
    UNKNOWN_ALG = "unknown_alg"
    WRONG_KEY = "wrong_key"
    """The header names another key id: another run's object, a node with the wrong key."""
    BAD_TAG = "bad_tag"
    """The right key id and a tag that does not verify: forged or corrupted."""
    TAGGED = "tagged"
    """A tagged object in an open run: this node has no key to judge it."""
    NEWER_FORMAT = "newer_format"
    """An authentic object in a newer gm's envelope (``gm/3 ``...): not to be skipped."""
    WRONG_FORMAT = "wrong_format"
    """An object of another wire format than the run's: a format-1 object (bare, or a body
    declaring format 1) in a format-2 run, or a format-2 body in a format-1 run
    (spec/protocol.md §16.7)."""
    BAD_SIGNATURE = "bad_signature"
    """Per-node keys: unsigned, or the signature does not verify under the signer's key."""
    NOT_ALLOWED = "not_allowed"
    """Per-node keys: the signer is not on the roster, or may not write this key."""
    REVOKED = "revoked"
    """Per-node keys: the run authority revoked the signer for this key's round
    (:mod:`gm_core.members`)."""


Verify = Callable[[bytes, bytes, bytes], bool]
"""``verify(public_key, message, signature)``: whether ``signature`` is the holder of
``public_key``'s over ``message`` (Ed25519 in the shell; deterministic and total)."""

Sign = Callable[[bytes], bytes]
"""``sign(message)``: this node's signature over ``message`` (its private key inside)."""


@attrs.frozen(kw_only=True)
class Signing:
    """Per-node keys in force for one run: its roster, how to verify, and how this node
    signs (``node``/``sign`` None: a reader that writes nothing, like ``gm status``)."""

    roster: Roster
    verify: Verify = attrs.field(repr=False)
    node: str | None = None
    sign: Sign | None = attrs.field(default=None, repr=False)
    certified: tuple[Member, ...] = ()
    """Members admitted since the manifest by the authority's certificates (learned by
    listing ``members/``, :mod:`gm_core.members`), in the order they were learned."""
    revoked: tuple[tuple[str, int], ...] = ()
    """``(node, from_round)`` for each node the authority revoked."""
    members: Mapping[str, Member] = attrs.field(init=False, repr=False, eq=False)
    revoked_from: Mapping[str, int] = attrs.field(init=False, repr=False, eq=False)

    @members.default
    def _members(self) -> Mapping[str, Member]:
        return {m.node: m for m in (*self.certified, *self.roster.members)}

    @revoked_from.default
    def _revoked_from(self) -> Mapping[str, int]:
        return dict(self.revoked)


@attrs.frozen(kw_only=True)
class Unauthenticated:
    """The verdict on an object that is not the run's: the reason and what to tell a person."""

    why: Why
    detail: str


@attrs.frozen(kw_only=True)
class RunAuth:
    """The subkeys derived from one run key; ``repr`` shows only the key id."""

    key_id: str
    tag_key: bytes = attrs.field(repr=False)
    payload_key: bytes = attrs.field(repr=False)
    """BLAKE3 key for payload digests (the shell hashes payloads)."""
    name_key: bytes = attrs.field(repr=False)
    """HMAC-SHA256 key for the names of create-once slots (protocol §16.4.1)."""
    resume_key: bytes = attrs.field(repr=False)
    """BLAKE3 key for the digest of a node's resume state (``nodes/{node}/resume.bin``): an
    outsider cannot write one that a restarting node loads (its optimizer, data position and
    local progress)."""
    signing: Signing | None = None
    """Per-node keys (None: the run key alone); set once the run's roster is known."""


def derive(run_key: bytes) -> RunAuth:
    """The subkeys and key id of ``run_key``; raises ValueError unless it is 32 bytes."""
    if type(run_key) is not bytes or len(run_key) != KEY_BYTES:
        raise ValueError(f"a run key is {KEY_BYTES} bytes ({2 * KEY_BYTES} hex characters)")
    key_id = _mac(run_key, _KEY_ID_CONTEXT).hex()[:KEY_ID_CHARS]
    return RunAuth(
        key_id=key_id,
        tag_key=_mac(run_key, _TAG_CONTEXT),
        payload_key=_mac(run_key, _PAYLOAD_CONTEXT),
        name_key=_mac(run_key, _NAME_CONTEXT),
        resume_key=_mac(run_key, _RESUME_CONTEXT),
    )


def parse_key(text: str) -> bytes:
    """The run key written as 64 hex characters (surrounding whitespace ignored)."""
    text = text.strip()
    if len(text) != 2 * KEY_BYTES or not set(text.encode()) <= _HEX | frozenset(b"ABCDEF"):
        raise ValueError(
            f"a run key is {2 * KEY_BYTES} hex characters (`gm keygen` prints one); "
            f"got {len(text)} characters"
        )
    return bytes.fromhex(text)


def header_key_id(data: bytes) -> str | None:
    """The key id a tagged object's header claims (None: untagged or unreadable).

    Unverified: for telling a person which key a run was created with, never for trust.
    """
    fields = _header_fields(data)
    return None if fields is None else fields[1]


@attrs.frozen(kw_only=True)
class Envelope:
    """How the objects of one run are sealed and opened: its key (None: open) and run id.

    The manifest is sealed with ``run_id=""`` (a joiner knows the run id only from it).
    """

    auth: RunAuth | None
    run_id: str
    body_format: int | None = None
    """The run's wire format (its manifest's ``format``): the number a record's body
    declares when this envelope packs it, and the only one it opens in an authenticated
    run. None: as the value holds it, and any (a reader that has not read the manifest)."""

    def seal(self, key: str, body: bytes) -> bytes:
        """The bytes to store at ``key`` for ``body`` (the body itself in an open run);
        signed too when this node signs (per-node keys)."""
        if self.auth is None:
            return body
        tag = _tag(self.auth, self.run_id, key, body)
        header = b"%s%s %s %s" % (MARKER, ALG.encode(), self.auth.key_id.encode(), tag)
        signing = self.auth.signing
        if signing is not None and signing.sign is not None and signing.node is not None:
            signature = signing.sign(signed_message(self.run_id, key, body)).hex()
            header += b" %s %s" % (signing.node.encode(), signature.encode())
        return b"%s\n%s" % (header, body)

    def pack(self, key: str, value: codec.Value) -> bytes:
        """``value`` encoded (declaring the run's format) and sealed for ``key``."""
        return self.seal(key, codec.encode(value, self.body_format))

    def open(self, key: str, data: bytes) -> bytes | Unauthenticated:
        """The body of the object ``data`` found at ``key``, or why it is not the run's."""
        if self.auth is None:
            if data.startswith(MARKER) or _newer_version(data) is not None:
                claimed = header_key_id(data)
                detail = f"{key} is tagged (key id {claimed}); this node has no run key"
                return Unauthenticated(why=Why.TAGGED, detail=detail)
            return data
        body = verify(self.auth, self.run_id, key, data)
        if isinstance(body, Unauthenticated):
            if body.why is Why.UNTAGGED and self.body_format == FORMAT_2 and data[:1] == b"{":
                detail = f"{key}: a format 1 object in a format 2 run (it carries no tag)"
                return Unauthenticated(why=Why.WRONG_FORMAT, detail=detail)
            return body
        other = other_format(self.body_format, key, body)
        if other is not None:
            return other
        if self.auth.signing is None:
            return body
        return _signed(self.auth.signing, self.run_id, key, data, body)

    def not_signed_by(self, data: bytes, named: str) -> str | None:
        """Why ``data``, which :meth:`open` accepted, is not signed by the node its body
        names as its writer (a record's ``closer``, a claim's ``node``); None when it is,
        or when per-node keys are not in force. Only closers sign either (may_write), so
        this keeps one closer from writing in another's name (protocol §16.3.2)."""
        if self.auth is None or self.auth.signing is None:
            return None
        fields = _header_fields(data)
        signer = fields[3] if fields is not None and len(fields) == 5 else None
        if signer == named:
            return None
        return f"signed by {signer}, but it names {named} as its writer"

    def slot_name(self, kind: str, subject: str, slot: int) -> str:
        """The name of slot ``slot`` of the create-once key ``kind``/``subject`` (§16.4.1).

        A keyed hash in an authenticated run, so an outsider cannot name a slot above 0
        (a guess is right with probability 2^-64); the same hash under a public key in
        an open run, where anyone can compute it and the slots only bound the cost of
        garbage, not who writes it.
        """
        name_key = _OPEN_NAME_KEY if self.auth is None else self.auth.name_key
        parts = (_SLOT_DOMAIN, self.run_id.encode(), kind.encode(), subject.encode())
        return _framed(name_key, (*parts, str(slot).encode())).hexdigest()[:SLOT_NAME_CHARS]


def verify(run_auth: RunAuth, run_id: str, key: str, data: bytes) -> bytes | Unauthenticated:
    """The body of ``data`` at ``key`` of run ``run_id`` when its tag verifies; else why not.

    Dispatch on the first bytes (spec/protocol.md §16.7): ``gm/2 `` is this envelope;
    ``gm/N `` with ``N > 2`` a newer gm's, whose header begins with the same three fields
    over the same tag input (the envelope is stable from format 2 on), so its tag is
    checked here too: authentic, it is ``newer_format`` (a reader stops at it instead of
    skipping it, and says to upgrade); not, it is refused like any forgery. Anything else
    (``{``: a format-1 or open run's object) is ``untagged``.
    """
    newer = None if data.startswith(MARKER) else _newer_version(data)
    if newer is None and not data.startswith(MARKER):
        return Unauthenticated(why=Why.UNTAGGED, detail=f"{key} carries no tag")
    header = _header(data, newer)
    if header is None:
        return Unauthenticated(why=Why.MALFORMED_HEADER, detail=f"{key}: unreadable header")
    fields, end = header
    alg, key_id, tag = fields[:3]
    if alg != ALG:
        return Unauthenticated(why=Why.UNKNOWN_ALG, detail=f"{key}: algorithm {alg[:32]!r}")
    if key_id != run_auth.key_id:
        detail = f"{key}: key id {key_id}, this node's {run_auth.key_id}"
        return Unauthenticated(why=Why.WRONG_KEY, detail=detail)
    body = data[end + 1 :]
    if not hmac.compare_digest(tag.encode(), _tag(run_auth, run_id, key, body)):
        return Unauthenticated(why=Why.BAD_TAG, detail=f"{key}: tag does not verify")
    if newer is not None:
        detail = f"{key} was written by a newer gm (envelope gm/{newer}): upgrade this node"
        return Unauthenticated(why=Why.NEWER_FORMAT, detail=detail)
    return body


_RECORD_KEYS = (
    keys.RoundKey,
    keys.SnapshotKey,
    keys.LeaseKey,
    keys.ClaimKey,
    keys.HeadKey,
    keys.MemberKey,
)
"""The keys whose objects are codec records, with a ``format`` the run's must equal (the
coordination markers, the finished summary and payloads have forms of their own)."""


def other_format(run_format: int | None, key: str, body: bytes) -> Unauthenticated | None:
    """Why the authentic ``body`` at ``key`` is not of the run's format (None: it is, it
    declares none, or a newer one: the codec names that, and a record probe stops at it)."""
    if run_format is None:
        return None
    declared = codec.format_number(body)  # a scan; the key is parsed only when it matters
    if declared is None or declared == run_format or declared not in FORMATS:
        return None
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return None
    if not isinstance(parsed, _RECORD_KEYS):
        return None
    detail = f"{key}: a format {declared} object in a format {run_format} run"
    return Unauthenticated(why=Why.WRONG_FORMAT, detail=detail)


def _newer_version(data: bytes) -> int | None:
    """``N`` when ``data`` begins ``gm/N `` with ``N`` above this envelope's version."""
    if not data.startswith(_FAMILY):
        return None
    digits = data[len(_FAMILY) : len(_FAMILY) + _VERSION_DIGITS + 1].split(b" ", 1)[0]
    if not digits.isdigit() or len(digits) > _VERSION_DIGITS or digits.startswith(b"0"):
        return None
    version = int(digits)
    return version if version > ENVELOPE_VERSION else None


def _signed(
    signing: Signing, run_id: str, key: str, data: bytes, body: bytes
) -> bytes | Unauthenticated:
    """``body`` when the object's signer may write ``key`` and its signature verifies."""
    fields = _header_fields(data)
    if fields is None or len(fields) < 5:
        return Unauthenticated(why=Why.BAD_SIGNATURE, detail=f"{key} is not signed")
    signer, signature = fields[3], fields[4]
    member = signing.members.get(signer)
    if member is None:
        detail = f"{key}: signer {signer} is not on the run's roster"
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=detail)
    refused = may_write(member, key)
    if refused is not None:
        return Unauthenticated(why=Why.NOT_ALLOWED, detail=f"{key}: {refused}")
    revoked = _revoked(signing, signer, key)
    if revoked is not None:
        return Unauthenticated(why=Why.REVOKED, detail=f"{key}: {revoked}")
    message = signed_message(run_id, key, body)
    if not signing.verify(bytes.fromhex(member.public_key), message, bytes.fromhex(signature)):
        detail = f"{key}: the signature does not verify under {signer}'s key"
        return Unauthenticated(why=Why.BAD_SIGNATURE, detail=detail)
    return body


def may_write(member: Member, key: str) -> str | None:
    """Why ``member`` may not write the object at ``key`` (None: it may), protocol §16.3.2.

    The tape and the coordination of closers (records, claims, the head, follow markers)
    are closers'; a snapshot is its learner's; a lease or a done marker is its node's.
    Other objects of the run (barriers, queues, the finished marker) any member may
    write. Payloads carry no header: the object naming them vouches for their digest.
    """
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return "not a key of the protocol"
    match parsed:
        case keys.RoundKey() | keys.ClaimKey() | keys.HeadKey() | keys.FollowKey():
            if ROLE_CLOSER not in member.roles:
                return f"{member.node} is not a closer (roles: {', '.join(member.roles)})"
        case keys.SnapshotKey(learner=learner):
            if ROLE_LEARNER not in member.roles:
                return f"{member.node} is not a learner (roles: {', '.join(member.roles)})"
            if learner != member.node:
                return f"{member.node} may publish only its own snapshots, not {learner}'s"
        case keys.LeaseKey(node=node) | keys.DoneKey(node=node):
            if node != member.node:
                return f"{member.node} may write only its own, not {node}'s"
        case _:
            pass
    return None


def _revoked(signing: Signing, signer: str, key: str) -> str | None:
    """Why ``signer``'s word at ``key`` no longer counts (None: it does): the authority
    revoked it from a round at or before the key's, or the key names no round."""
    since = signing.revoked_from.get(signer)
    if since is None:
        return None
    round_ = round_of(key)
    if round_ is not None and round_ < since:
        return None
    return f"{signer} is revoked from round {since}"


def round_of(key: str) -> int | None:
    """The round a protocol key belongs to (None: a key of no round, or no key of ours)."""
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return None
    match parsed:
        case (
            keys.RoundKey(round=r)
            | keys.SnapshotKey(round=r)
            | keys.ClaimKey(round=r)
            | keys.FollowKey(round=r)
            | keys.PayloadKey(round=r)
        ):
            return r
        case _:
            return None


def signed_message(run_id: str, key: str, body: bytes) -> bytes:
    """What a per-node signature covers: the tag's framed input under its own domain."""
    return frames((_SIGNATURE_DOMAIN, run_id.encode(), key.encode())) + body


def roster_message(roster: Roster) -> bytes:
    """What the roster's authority signs: every member's id, roles and key, in order."""
    parts = [_ROSTER_DOMAIN, roster.authority.encode()]
    for m in roster.members:
        parts += [m.node.encode(), ",".join(m.roles).encode(), m.public_key.encode()]
    return frames(tuple(parts))


def frames(parts: tuple[bytes, ...]) -> bytes:
    """``parts`` each preceded by its length (8 bytes, big-endian): no two inputs collide."""
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _tag(run_auth: RunAuth, run_id: str, key: str, body: bytes) -> bytes:
    """HMAC-SHA256 under the run's tag key over the framed domain, run id, key and body
    (protocol.md §16.2), in hex: continued from the run's two padded-key states."""
    inner, outer = _run_pads(run_auth.tag_key, run_id)
    running = inner.copy()
    named = key.encode()
    running.update(len(named).to_bytes(8, "big") + named)
    running.update(body)
    done = outer.copy()
    done.update(running.digest())
    return done.hexdigest().encode()


_SHA256_BLOCK = 64


@functools.lru_cache(maxsize=16)
def _run_pads(tag_key: bytes, run_id: str) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256 (RFC 2104) as its two SHA-256 states: the inner one keyed (``key ⊕
    ipad``) and fed every tag's first two framed parts (domain, run id), the outer one
    keyed (``key ⊕ opad``); a tag copies both. Once per run, not per object: the key
    schedule, and ``hmac``'s Python wrapper around each of a tag's calls, were most of a
    record-sized tag's cost on a closer's loop thread (cold: 18-31 µs, these 9-15 µs).
    Never updated themselves: copies are."""
    assert len(tag_key) <= _SHA256_BLOCK, "a run's subkeys are 32 bytes (derive)"
    padded = tag_key.ljust(_SHA256_BLOCK, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
    for part in (_DOMAIN, run_id.encode()):
        inner.update(len(part).to_bytes(8, "big") + part)
    return inner, outer


def _framed(mac_key: bytes, parts: tuple[bytes, ...]) -> hmac.HMAC:
    """An HMAC-SHA256 over ``parts``, each framed by its length (no two inputs collide)."""
    mac = hmac.new(mac_key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac


def for_run(run_id: str, run_auth: RunAuth | None, body_format: int | None = None) -> Envelope:
    """The envelope of run ``run_id``'s objects other than its manifest (``body_format``:
    the run's wire format, its manifest's ``format``; None: any, for a reader)."""
    return Envelope(auth=run_auth, run_id=run_id, body_format=body_format)


def of_run(manifest: Manifest, run_auth: RunAuth | None) -> Envelope:
    """The envelope of the objects of the run ``manifest`` starts, in its wire format."""
    return for_run(manifest.run_id, run_auth, manifest.format)


def for_machine(node: str, manifest: Manifest, run_auth: RunAuth | None) -> Envelope:
    """The envelope a learner or closer machine of ``node`` seals and opens with.

    Raises ValueError for an invalid node id, or a ``run_auth`` that does not match the
    manifest (:func:`mismatch`): both are the caller's configuration, refused before the
    machine exists."""
    if not keys.valid_id(node):
        raise ValueError(f"invalid node id {node!r}")
    refused = mismatch(manifest.auth, run_auth)
    if refused is not None:
        raise ValueError(refused)
    return of_run(manifest, run_auth)


def for_manifest(run_auth: RunAuth | None) -> Envelope:
    """The envelope of a manifest: sealed with no run id, which only its body names, and
    never signed (the roster that would judge a signature is inside it)."""
    if run_auth is not None and run_auth.signing is not None:
        run_auth = attrs.evolve(run_auth, signing=None)
    return Envelope(auth=run_auth, run_id="")


def info(run_auth: RunAuth | None) -> AuthInfo | None:
    """What a manifest created with ``run_auth`` says about it (None: an open run)."""
    return None if run_auth is None else AuthInfo(alg=ALG, key_id=run_auth.key_id)


def mismatch(manifest_auth: AuthInfo | None, run_auth: RunAuth | None) -> str | None:
    """Why a node configured with ``run_auth`` cannot take part in a run whose manifest
    says ``manifest_auth`` (None: it can). The node's configuration decides the mode,
    never the bucket's word, so a keyed node refuses an open run too."""
    if manifest_auth is None and run_auth is None:
        return None
    if manifest_auth is None:
        return (
            "the run is open (its objects are untagged) but this node has a run key: "
            "unset GM_RUN_KEY and GM_RUN_KEY_FILE, or pass run_key=None"
        )
    if run_auth is None:
        return (
            f"the run is authenticated (run key id {manifest_auth.key_id}): "
            "set GM_RUN_KEY or GM_RUN_KEY_FILE, or pass run_key="
        )
    if manifest_auth.key_id != run_auth.key_id:
        return (
            f"this node's run key has id {run_auth.key_id}; "
            f"the run was created with key id {manifest_auth.key_id}"
        )
    return None


def _header_fields(data: bytes, newer: int | None = None) -> list[str] | None:
    """The header's fields after the marker, when it is a well-formed short ASCII line:
    ``alg key_id tag``, then ``signer signature`` when the writer signs. A newer envelope
    (``gm/{newer} ``) keeps those first three fields; what follows is its own."""
    header = _header(data, newer)
    return None if header is None else header[0]


def _header(data: bytes, newer: int | None) -> tuple[list[str], int] | None:
    """:func:`_header_fields`, and where the header line ends (the body starts after it)."""
    marker = MARKER if newer is None else b"%s%d " % (_FAMILY, newer)
    if not data.startswith(marker):
        return None
    end = data.find(b"\n", 0, HEADER_MAX_BYTES)
    if end < 0:
        return None
    line = data[len(marker) : end]
    if not line.isascii():
        return None
    fields = line.decode("ascii").split(" ")
    if newer is not None and len(fields) >= 3:
        fields = fields[:3]
    if len(fields) not in (3, 5):
        return None
    key_id, tag = fields[1], fields[2]
    if not _is_hex(key_id, KEY_ID_CHARS) or not _is_hex(tag, TAG_CHARS):
        return None
    if len(fields) == 5 and not (keys.valid_id(fields[3]) and _is_hex(fields[4], SIGNATURE_CHARS)):
        return None
    return fields, end


def _is_hex(text: str, length: int) -> bool:
    """Whether ``text`` is ``length`` lowercase hex digits (strip leaves nothing of them)."""
    return len(text) == length and not text.strip(_HEX_DIGITS)


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()
