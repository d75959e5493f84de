"""Creating a run once, or adopting the one in the bucket: the manifest and initial parameters.

Theory of operation
-------------------
A run is born when its manifest is written create-once. Each node computes the
manifest it would write — its algorithm config, its model's schema and the plan
they imply — and reads the manifest (``manifest.json``, or the lowest slot above it
that holds a manifest, when garbage was written there first: spec/protocol.md §16.4.1):

- present: the node adopts it if :func:`gm_core.manifest.manifest_mismatch`
  finds no difference, and fails with a :class:`RunMismatchError` naming every
  difference otherwise (nothing is written);
- absent: the node uploads its initial parameters, one payload per fragment in
  the commit format (content-addressed, so a retried or repeated upload is a
  no-op), then writes the manifest pointing at them — payload before pointer.
  If another node's manifest won the race, that one is read and judged as above;
  the loser's payloads are left for the sweeper.

A closer-only node has no model and therefore no schema of its own: it adopts
whatever run it finds, and there must be one.

A node that pins the manifest's digest (``manifest_digest=``, trust on first use:
spec/protocol.md §16.5.2) adopts only that manifest: any other is refused by
:class:`ManifestPinError` when it is read, before anything is trained or loaded, and
such a node never creates a run (the run it was told to join would not be the one it
wrote).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import attrs

from gm_core import auth, codec, keys, plan
from gm_core.auth import RunAuth, Unauthenticated, Why
from gm_core.manifest import manifest_mismatch, parse_digest, pin_mismatch
from gm_core.numerics.arrays import F32
from gm_core.records import (
    FORMAT_2,
    AlgorithmConfig,
    AuthInfo,
    FragmentState,
    FrozenTensor,
    Manifest,
    PayloadRef,
    Roster,
    TensorSpec,
)
from gm_shell.fragments import FragmentCodec, Role, payload_key
from gm_shell.mailbox import Mailbox, PutOutcome, TooLargeError

LOG = logging.getLogger("gm")

INIT_ROUND = 0
"""Initial payloads live under round 0's payload folder, pinned until each fragment commits."""


class RunError(RuntimeError):
    """The bucket holds no usable run for this node."""


class RunMismatchError(RunError):
    """This node's config or model differs from the run's; the message names each difference."""


class NotDescendedError(RunError):
    """A resumed node's tape does not descend from the record it adopted before it stopped
    (spec/protocol.md §16.5.2): the tape was replaced or forked while it was away, or it
    joined a stray chain. Nothing was trained; the message names the round that breaks."""


class ManifestPinError(RunError):
    """The manifest in the bucket is not the one this node pinned (``manifest_digest=``):
    another run at the prefix, or a forged or replaced manifest. Nothing was trained or
    loaded; the message names both digests."""


def draft_manifest(
    *,
    run_id: str,
    node: str,
    config: AlgorithmConfig,
    schema: tuple[TensorSpec, ...],
    frozen: tuple[FrozenTensor, ...] = (),
    run_auth: RunAuth | None = None,
    roster: Roster | None = None,
) -> Manifest:
    """The manifest this node would write, without initial payloads yet (``roster``: the
    run's per-node keys, spec/protocol.md §16.3)."""
    return Manifest(
        run_id=run_id,
        created_by=node,
        config=config,
        schema=schema,
        plan=plan.make_plan(schema, config),
        init=(),
        frozen=frozen,
        auth=auth.info(run_auth),
        chained=True,
        roster=roster,
        format=FORMAT_2,
    )


async def read_manifest(
    mailbox: Mailbox, run_auth: RunAuth | None, pinned: str | None = None
) -> Manifest | None:
    """The run's manifest, or None if the run does not exist yet.

    The manifest is the lowest *valid* of the manifest key's slots (spec/protocol.md
    §16.4.1): opened with this node's key (``run_auth``, None for an open node) and
    decoded. An object that is no manifest this node could use (garbage, a forged tag
    under this node's key id) is skipped and named in the log; one that is a manifest
    of the other mode or names another key id stops the search with what to do
    (:class:`RunError`): it may be a real run that this node was started wrongly for,
    so nothing is ever created above it. With ``pinned`` (a
    :func:`gm_core.manifest.digest`), any other manifest raises :class:`ManifestPinError`.
    """
    found = await find_manifest(mailbox, run_auth, pinned)
    for skipped in found.skipped:
        LOG.warning("%s: %s", mailbox.url, skipped)
    return found.manifest


@attrs.frozen
class Found:
    """What :func:`find_manifest` found: the manifest (None: not yet) and each slot below it
    that held an object it skipped, with why (``manifest.json: unreadable: ...``)."""

    manifest: Manifest | None
    skipped: tuple[str, ...]


async def find_manifest(
    mailbox: Mailbox, run_auth: RunAuth | None, pinned: str | None = None
) -> Found:
    """:func:`read_manifest`'s search, saying what it skipped (for ``gm status``)."""
    skipped: list[str] = []
    for slot in range(keys.MANIFEST_SLOTS):
        got = await _get_manifest(mailbox, slot)
        if got is None:
            return Found(manifest=None, skipped=tuple(skipped))
        found = _judge_manifest(mailbox.url, slot, got, run_auth)
        if isinstance(found, Manifest):
            refused = None if pinned is None else pin_mismatch(pinned, found)
            if refused is not None:
                raise ManifestPinError(f"{mailbox.url}: {refused}")
            return Found(manifest=found, skipped=tuple(skipped))
        skipped.append(f"{keys.manifest(slot)}: {found}")
    raise RunError(_exhausted(mailbox.url))


def _exhausted(url: str) -> str:
    return (
        f"{url}: all {keys.MANIFEST_SLOTS} manifest slots hold objects that are no manifest"
        " this node can use (slots_exhausted): remove them, or use another prefix"
    )


async def _get_manifest(mailbox: Mailbox, slot: int) -> bytes | None:
    try:
        got = await mailbox.get(keys.manifest(slot), max_bytes=codec.MAX_RECORD_BYTES)
    except TooLargeError as error:  # a manifest this node cannot read: never write above it
        raise RunError(f"{mailbox.url}: the run's manifest is unreadable: {error}") from error
    return None if got is None else got.data


def _judge_manifest(url: str, slot: int, data: bytes, run_auth: RunAuth | None) -> Manifest | str:
    """The manifest at ``slot``, or why it is skipped; :class:`RunError` for a manifest of
    another mode or key (the node stops: it may have been started without the run's key)."""
    key = keys.manifest(slot)
    body = auth.for_manifest(run_auth).open(key, data)
    if isinstance(body, Unauthenticated):
        foreign = _foreign(body, data, run_auth)
        if foreign is not None:
            raise RunError(f"{url}: {foreign}")
        return f"not authentic ({body.why}): {body.detail}"
    try:
        manifest = codec.decode(Manifest, body)
    except codec.CodecError as error:
        return f"unreadable: {error}"
    problem = auth.mismatch(manifest.auth, run_auth)
    if problem is not None:
        raise RunError(f"{url}: {problem}")
    return manifest


def pinned_digest(manifest_digest: str | None) -> str | None:
    """``manifest_digest=`` as given by a caller, checked (ValueError names the form)."""
    return None if manifest_digest is None else parse_digest(manifest_digest)


def _foreign(verdict: Unauthenticated, data: bytes, run_auth: RunAuth | None) -> str | None:
    """What to tell a person whose node found a manifest of another mode or key (None: the
    object is garbage, or forged under this node's own key id, and is skipped)."""
    if verdict.why is Why.NEWER_FORMAT:  # authentic: never skipped, never written above
        return f"the run's manifest was written by a newer gm ({verdict.detail}): upgrade this node"
    claimed = auth.header_key_id(data)
    if claimed is not None:
        return auth.mismatch(AuthInfo(alg=auth.ALG, key_id=claimed), run_auth)
    if verdict.why is Why.UNTAGGED and _decodes(data):  # an open run's manifest
        return auth.mismatch(None, run_auth)
    return None


def _decodes(data: bytes) -> bool:
    try:
        codec.decode(Manifest, data)
    except codec.CodecError:
        return False
    return True


def adopt(mine: Manifest | None, theirs: Manifest, url: str) -> Manifest:
    """``theirs``, if this node may join it."""
    if mine is not None:
        problem = manifest_mismatch(mine, theirs)
        if problem is not None:
            raise RunMismatchError(f"{url}: {problem}")
    return theirs


async def create(
    mailbox: Mailbox,
    draft: Manifest,
    initial: Sequence[F32],
    run_auth: RunAuth | None,
    *,
    momenta: Sequence[F32 | None] = (),
) -> Manifest | None:
    """Upload ``initial`` and write the manifest; None if another node's manifest won.

    ``momenta`` (per fragment; empty: none, a new run's): the outer momentum a run carried
    over from another starts with (``gm migrate``), so its outer optimizer goes on where the
    old one stood instead of starting afresh."""
    fragment_codec = FragmentCodec(draft, payload_key=payload_key(run_auth))

    async def put(fragment: int, role: Role, x: F32) -> PayloadRef:
        data, ref = await asyncio.to_thread(fragment_codec.encode, fragment, role, INIT_ROUND, x)
        await mailbox.put_once(ref.key, data)
        return ref

    async def upload(fragment: int, x: F32) -> FragmentState:
        theta = await put(fragment, Role.THETA, x)
        m = momenta[fragment] if momenta else None
        momentum = None if m is None else await put(fragment, Role.MOMENTUM, m)
        return FragmentState(version=0, theta=theta, momentum=momentum)

    states = await asyncio.gather(*(upload(f, x) for f, x in enumerate(initial)))
    manifest = attrs.evolve(draft, init=tuple(states))
    sealing = auth.for_manifest(run_auth)
    for slot in range(keys.MANIFEST_SLOTS):  # the lowest slot not holding garbage (§16.4.2)
        key = keys.manifest(slot)
        if await mailbox.put_once(key, sealing.pack(key, manifest)) is PutOutcome.CREATED:
            return manifest
        taken = await _get_manifest(mailbox, slot)
        if taken is None:
            return None  # gone again: the caller reads the run afresh
        found = _judge_manifest(mailbox.url, slot, taken, run_auth)
        if isinstance(found, Manifest):
            return None  # another node's run won
        LOG.warning("%s: %s: skipped (%s)", mailbox.url, key, found)
    raise RunError(_exhausted(mailbox.url))
