"""Per-node keys (spec/protocol.md §16.3): Ed25519 keys, rosters, and where a node's key comes from.

Theory of operation
-------------------
With a run key alone every member can write as any node. Per-node keys confine each:
every object a node writes is also signed with its own Ed25519 key, and every reader
accepts an object only when its signer is on the run's roster and may write its key
(gm_core.auth.may_write: records, claims, the head and follow markers only by closers;
a snapshot only by its learner; a lease or done marker only by its node).

* **Keys.** ``gm keygen --node`` prints a private key (64 hex characters: Ed25519's
  32-byte seed) and, on standard error, its public key. A node reads its private key
  from ``node_key=``, else ``GM_NODE_KEY`` (hex), else ``GM_NODE_KEY_FILE``.
* **The roster.** ``gm roster`` makes it: the members' ids, roles and public keys,
  signed by an *authority* key (another ``gm keygen --node`` key, kept by whoever
  admits nodes). The node that creates the run puts it in the manifest (``roster=``, or
  ``GM_ROSTER_FILE``), so the run key's tag and the manifest's digest cover it. A node
  told the authority's public key (``GM_RUN_AUTHORITY``) joins only a run whose roster
  that authority signed; every reader checks the roster's signature against the
  authority it names.
* **Checking.** The core opens every object (gm_core.auth.Envelope.open) and calls the
  verification passed in here; ``cryptography`` (an optional extra, ``nodekeys``) does
  the Ed25519 arithmetic. Public keys are parsed once each (a bounded cache).

Why an extra and not a dependency: most runs use the run key alone, and ``cryptography``
is a compiled wheel of several MB; a run that uses per-node keys names the extra when it
is missing, before anything starts (gm_shell.extras).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from gm_core import auth, codec, members
from gm_core.auth import RunAuth, Signing
from gm_core.records import ROSTER_ROLES, Certificate, Manifest, Member, Revocation, Roster
from gm_shell.extras import require
from gm_shell.runkey import FromEnv, read_key_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ENV_NODE_KEY = "GM_NODE_KEY"
ENV_NODE_KEY_FILE = "GM_NODE_KEY_FILE"
ENV_ROSTER_FILE = "GM_ROSTER_FILE"
ENV_AUTHORITY = "GM_RUN_AUTHORITY"
_PUBLIC_KEYS_CACHED = 4096

NodeKey = bytes | str | None | FromEnv
"""What ``node_key=`` accepts: the private key's bytes or hex, None (none), or FROM_ENV."""

RosterArg = Roster | str | Path | None | FromEnv
"""What ``roster=`` accepts: a :class:`Roster`, a roster file's path, None, or FROM_ENV."""


class NodeKeyError(ValueError):
    """A node key, roster or authority that cannot be used here; the message says why."""


def _require() -> None:
    require("per-node keys", ("cryptography",), extra="nodekeys")


def keygen() -> tuple[str, str]:
    """A fresh Ed25519 key pair as hex: (private key, public key)."""
    _require()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate().private_bytes_raw()
    return private.hex(), public_key(private)


def public_key(private: bytes) -> str:
    """The public key (hex) of the Ed25519 private key ``private`` (32 bytes)."""
    _require()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw().hex()


def signer(private: bytes) -> auth.Sign:
    """How the holder of ``private`` signs (Ed25519: deterministic)."""
    _require()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(private)
    return key.sign


@functools.lru_cache(maxsize=_PUBLIC_KEYS_CACHED)
def _public(public: bytes) -> Ed25519PublicKey | None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        return Ed25519PublicKey.from_public_bytes(public)
    except ValueError:
        return None


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the holder of ``public``'s Ed25519 signature of ``message``."""
    from cryptography.exceptions import InvalidSignature

    key = _public(public)
    if key is None:
        return False
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def make_roster(authority: bytes, members: Sequence[Member]) -> Roster:
    """A roster of ``members`` signed by the authority's private key ``authority``."""
    unsigned = Roster(authority=public_key(authority), members=tuple(members), signature="0" * 128)
    codec.encode(unsigned)  # names a malformed member now, not at the run's creation
    signature = signer(authority)(auth.roster_message(unsigned)).hex()
    return attrs.evolve(unsigned, signature=signature)


def certify(authority: bytes, run_id: str, member: Member) -> Certificate:
    """The certificate by which the authority ``authority`` admits ``member`` to run ``run_id``."""
    unsigned = Certificate(member=member, signature="0" * 128)
    codec.encode(unsigned)  # names a malformed member now
    message = members.certificate_message(run_id, member)
    return attrs.evolve(unsigned, signature=signer(authority)(message).hex())


def revoke(authority: bytes, run_id: str, node: str, from_round: int, reason: str) -> Revocation:
    """The revocation by which the authority ``authority`` shuts ``node`` out of run ``run_id``
    from round ``from_round`` on."""
    unsigned = Revocation(node=node, from_round=from_round, reason=reason, signature="0" * 128)
    codec.encode(unsigned)  # names a malformed id, round or reason now
    message = members.revocation_message(run_id, node, from_round, reason)
    return attrs.evolve(unsigned, signature=signer(authority)(message).hex())


def parse_member(text: str) -> Member:
    """``node:role[+role]:public_key`` as ``gm roster --member`` takes it."""
    parts = text.split(":")
    if len(parts) != 3:
        raise NodeKeyError(f"{text!r}: expected node:roles:public_key (roles: learner+closer)")
    node, roles, public = parts
    member = Member(node=node, roles=tuple(roles.split("+")), public_key=public.strip().lower())
    try:
        codec.encode(member)
    except codec.CodecError as error:
        raise NodeKeyError(f"{text!r}: {error}") from None
    return member


def check_roster(roster: Roster, authority: str | None = None) -> str | None:
    """Why ``roster`` is not to be believed (None: its authority signed it, and it is
    ``authority`` when this node was told one)."""
    _require()
    if authority is not None and roster.authority != authority.strip().lower():
        return (
            f"the run's roster was issued by authority {roster.authority}, "
            f"this node trusts {authority.strip().lower()} ({ENV_AUTHORITY})"
        )
    message = auth.roster_message(roster)
    if not verify(bytes.fromhex(roster.authority), message, bytes.fromhex(roster.signature)):
        return "the run's roster is not signed by the authority it names"
    return None


def signing_for(
    manifest: Manifest,
    node: str | None,
    private: bytes | None,
    roles: Sequence[str] = (),
    learned: Signing | None = None,
) -> Signing | None:
    """The per-node keys of a run with ``manifest`` for ``node`` (None: it writes nothing,
    like ``gm status``), which must sign with ``private`` and hold ``roles``; None when
    the run has no roster. ``learned``: the roster with what ``members/`` adds
    (gm_shell.members), where ``node`` may be admitted or revoked. Raises
    :class:`NodeKeyError` naming what does not fit."""
    roster = manifest.roster
    if roster is None:
        if private is not None:
            raise NodeKeyError(
                "this node has a node key but the run has no roster (it was created "
                f"without per-node keys): unset {ENV_NODE_KEY} and {ENV_NODE_KEY_FILE}"
            )
        return None
    problem = check_roster(roster, _from_env(ENV_AUTHORITY))
    if problem is not None:
        raise NodeKeyError(problem)
    known = Signing(roster=roster, verify=verify) if learned is None else learned
    if node is None:
        return known
    member = known.members.get(node)
    if member is None:
        raise NodeKeyError(
            f"node {node} is neither on the run's roster nor admitted under members/ "
            "(ask its authority: gm roster add)"
        )
    since = known.revoked_from.get(node)
    if since is not None:
        raise NodeKeyError(f"node {node} is revoked from round {since} (members/{node}/)")
    if private is None:
        raise NodeKeyError(
            f"the run has per-node keys: give node {node} its key "
            f"({ENV_NODE_KEY} or {ENV_NODE_KEY_FILE}, or node_key=)"
        )
    if public_key(private) != member.public_key:
        raise NodeKeyError(f"this node key is not {node}'s on the run's roster")
    lacking = [r for r in roles if r not in member.roles]
    if lacking:
        raise NodeKeyError(
            f"node {node} has roles {'+'.join(member.roles)} on the roster; "
            f"this node would also act as {'+'.join(lacking)}"
        )
    return attrs.evolve(known, node=node, sign=signer(private))


def with_signing(run_auth: RunAuth | None, signing: Signing | None) -> RunAuth | None:
    """``run_auth`` with per-node keys in force (unchanged when there are none)."""
    if run_auth is None or signing is None:
        return run_auth
    return attrs.evolve(run_auth, signing=signing)


def reader(run_auth: RunAuth | None, manifest: Manifest) -> RunAuth | None:
    """``run_auth`` for a node that only reads the run (``align()``, ``gm status``)."""
    return with_signing(run_auth, signing_for(manifest, None, None))


def resolve_node_key(node_key: NodeKey) -> bytes | None:
    """The node's private key (32 bytes) from ``node_key=`` or the environment."""
    if isinstance(node_key, FromEnv):
        node_key = _from_env(ENV_NODE_KEY) or _read_file(ENV_NODE_KEY_FILE)
    if node_key is None:
        return None
    try:  # the same form as a run key: 32 bytes, 64 hex characters
        key = auth.parse_key(node_key) if isinstance(node_key, str) else node_key
    except ValueError:
        raise NodeKeyError(
            f"a node key is {2 * auth.KEY_BYTES} hex characters (`gm keygen --node` prints one)"
        ) from None
    if len(key) != auth.KEY_BYTES:
        raise NodeKeyError(f"node key: {auth.KEY_BYTES} bytes expected, got {len(key)}")
    return key


def read_private(path: str) -> bytes:
    """A private key from the file at ``path`` (hex, as ``gm keygen --node`` prints)."""
    key = resolve_node_key(read_key_file(path, path, "a node key", NodeKeyError))
    assert key is not None
    return key


def resolve_roster(roster: RosterArg) -> Roster | None:
    """The roster a creating node writes into the manifest (``roster=`` or the environment)."""
    if isinstance(roster, FromEnv):
        path = os.environ.get(ENV_ROSTER_FILE)
        roster = Path(path) if path else None
    if roster is None or isinstance(roster, Roster):
        return roster
    what = f"roster {roster}"
    text = read_key_file(str(roster), what, "a roster", NodeKeyError, codec.MAX_RECORD_BYTES)
    try:
        return codec.decode(Roster, text.encode())
    except codec.CodecError as error:
        raise NodeKeyError(f"roster {roster}: {error}") from None


def roles_of(learns: bool, closes: bool) -> tuple[str, ...]:
    """The roster roles a node that learns and/or closes needs."""
    return tuple(r for r, on in zip(ROSTER_ROLES, (learns, closes), strict=True) if on)


def _from_env(name: str) -> str | None:
    return os.environ.get(name) or None


def _read_file(variable: str) -> str | None:
    path = os.environ.get(variable)
    if not path:
        return None
    return read_key_file(path, f"{variable}={path}", "a node key", NodeKeyError)
