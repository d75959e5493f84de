"""Creating a run once, or adopting the one in the bucket: the manifest and initial parameters.

Theory of operation
-------------------
A run is born when its manifest is written create-once. Each node computes the
manifest it would write — its algorithm config, its model's schema and the plan
they imply — and reads ``manifest.json``:

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
from collections.abc import Sequence

import attrs

from gm_core import auth, codec, keys, plan
from gm_core.auth import RunAuth, Unauthenticated, Why
from gm_core.manifest import manifest_mismatch, parse_digest, pin_mismatch
from gm_core.numerics.arrays import F32
from gm_core.records import (
    AlgorithmConfig,
    AuthInfo,
    FragmentState,
    FrozenTensor,
    Manifest,
    Roster,
    TensorSpec,
)
from gm_shell.fragments import FragmentCodec, Role, payload_key
from gm_shell.mailbox import Mailbox, PutOutcome, TooLargeError

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
    )


async def read_manifest(
    mailbox: Mailbox, run_auth: RunAuth | None, pinned: str | None = None
) -> Manifest | None:
    """The run's manifest, or None if the run does not exist yet.

    Opened with this node's key (``run_auth``, None for an open node): a manifest this
    node cannot verify, or one of the other mode, is refused with what to do. With
    ``pinned`` (a :func:`gm_core.manifest.digest`), any other manifest raises
    :class:`ManifestPinError`.
    """
    try:
        got = await mailbox.get(keys.manifest(), max_bytes=codec.MAX_RECORD_BYTES)
    except TooLargeError as error:
        raise RunError(f"{mailbox.url}: the run's manifest is unreadable: {error}") from error
    if got is None:
        return None
    body = auth.for_manifest(run_auth).open(keys.manifest(), got.data)
    if isinstance(body, Unauthenticated):
        raise RunError(f"{mailbox.url}: {_refusal(body, got.data, run_auth)}")
    try:
        manifest = codec.decode(Manifest, body)
    except codec.CodecError as error:
        raise RunError(f"{mailbox.url}: the run's manifest is unreadable: {error}") from error
    problem = auth.mismatch(manifest.auth, run_auth)
    if problem is not None:
        raise RunError(f"{mailbox.url}: {problem}")
    refused = None if pinned is None else pin_mismatch(pinned, manifest)
    if refused is not None:
        raise ManifestPinError(f"{mailbox.url}: {refused}")
    return manifest


def pinned_digest(manifest_digest: str | None) -> str | None:
    """``manifest_digest=`` as given by a caller, checked (ValueError names the form)."""
    return None if manifest_digest is None else parse_digest(manifest_digest)


def _refusal(verdict: Unauthenticated, data: bytes, run_auth: RunAuth | None) -> str:
    """What to tell a person whose node cannot verify the manifest it found."""
    claimed = auth.header_key_id(data)
    if verdict.why is Why.UNTAGGED or claimed is not None:
        theirs = AuthInfo(alg=auth.ALG, key_id=claimed) if claimed is not None else None
        problem = auth.mismatch(theirs, run_auth)
        if problem is not None:
            return problem
    return f"the run's manifest is not authentic ({verdict.why}): {verdict.detail}"


def adopt(mine: Manifest | None, theirs: Manifest, url: str) -> Manifest:
    """``theirs``, if this node may join it."""
    if mine is not None:
        problem = manifest_mismatch(mine, theirs)
        if problem is not None:
            raise RunMismatchError(f"{url}: {problem}")
    return theirs


async def create(
    mailbox: Mailbox, draft: Manifest, initial: Sequence[F32], run_auth: RunAuth | None
) -> Manifest | None:
    """Upload ``initial`` and write the manifest; None if another node's manifest won."""
    fragment_codec = FragmentCodec(draft, payload_key=payload_key(run_auth))

    async def upload(fragment: int, x: F32) -> FragmentState:
        data, ref = await asyncio.to_thread(
            fragment_codec.encode, fragment, Role.THETA, INIT_ROUND, x
        )
        await mailbox.put_once(ref.key, data)
        return FragmentState(version=0, theta=ref, momentum=None)

    states = await asyncio.gather(*(upload(f, x) for f, x in enumerate(initial)))
    manifest = attrs.evolve(draft, init=tuple(states))
    data = auth.for_manifest(run_auth).pack(keys.manifest(), manifest)
    outcome = await mailbox.put_once(keys.manifest(), data)
    return manifest if outcome is PutOutcome.CREATED else None
