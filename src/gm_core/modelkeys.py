"""A stand-in for Ed25519 where gm_core runs without the shell: the model cluster, the
simulator, the model checker and the core's property tests.

Theory of operation
-------------------
Per-node keys (spec/protocol.md §16.3) need a signature scheme, and gm_core imports none
(it stays attrs, cattrs and numpy: ``tests/test_purity.py``); the shell passes Ed25519
in (gm_shell.nodekeys). A model needs only what the protocol relies on: a node can
sign as itself, a verifier can tell whether a signature is the named node's, and
nobody can sign as another. Here a node's secret is derived from its id, its "public
key" is a hash of the secret, a signature is an HMAC under the secret, and the
verifier of a roster holds the secrets of its members by public key — an oracle no
modelled forger consults: the forger signs with its own node's :func:`sign_as`. Not a
signature scheme for anything real (whoever holds the verifier can sign as anyone).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping, Sequence

from gm_core import auth
from gm_core.records import Member, Roster

AUTHORITY = "authority"
"""The name whose stand-in key signs a model roster."""


def _secret(node: str) -> bytes:
    return hashlib.sha256(b"gm model node key\x00" + node.encode()).digest()


def public_key(node: str) -> str:
    """``node``'s stand-in public key (64 hex characters, like an Ed25519 one)."""
    return hashlib.sha256(b"gm model public key\x00" + _secret(node)).hexdigest()


def sign_as(node: str) -> auth.Sign:
    """How ``node`` signs: a 64-byte value only its secret gives."""
    secret = _secret(node)

    def sign(message: bytes) -> bytes:
        first = hmac.new(secret, message, hashlib.sha256).digest()
        return first + hmac.new(secret, first, hashlib.sha256).digest()

    return sign


def verifier(nodes: Sequence[str]) -> auth.Verify:
    """A verifier that knows the stand-in keys of ``nodes`` (and the authority's)."""
    signers = {bytes.fromhex(public_key(n)): sign_as(n) for n in (*nodes, AUTHORITY)}

    def verify(public: bytes, message: bytes, signature: bytes) -> bool:
        sign = signers.get(public)
        return sign is not None and hmac.compare_digest(sign(message), signature)

    return verify


def roster(roles: Mapping[str, Sequence[str]]) -> Roster:
    """A roster admitting each node of ``roles`` with those roles, signed by the authority."""
    members = tuple(
        Member(node=n, roles=tuple(r), public_key=public_key(n)) for n, r in sorted(roles.items())
    )
    unsigned = Roster(authority=public_key(AUTHORITY), members=members, signature="0" * 128)
    signature = sign_as(AUTHORITY)(auth.roster_message(unsigned)).hex()
    return Roster(authority=unsigned.authority, members=members, signature=signature)


@functools.cache
def signing(the_roster: Roster, node: str | None, also: tuple[str, ...] = ()) -> auth.Signing:
    """``node``'s per-node keys in a run with ``the_roster`` (None: a reader). ``also``:
    ids off the roster whose stand-in keys the verifier knows anyway (a test's outsider
    that signs: its signature verifies, and it is still not allowed). Cached: one value
    per argument, so states holding it compare equal (its functions compare by identity)."""
    nodes = [m.node for m in the_roster.members] + list(also)
    return auth.Signing(
        roster=the_roster,
        verify=verifier(nodes),
        node=node,
        sign=None if node is None else sign_as(node),
    )
