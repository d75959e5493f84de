"""Loading the newest committed model without joining the run (evaluation, and close).

Theory of operation
-------------------
Reading a run needs no lease and writes nothing: the head hint names a recent
round, round records are probed forward from it one expected key at a time
until one is missing (a GET that misses is cheap) — in a chained run the tip is
adopted only once it chains to the record before it, as a joining node does
(:mod:`gm_core.tip`: a stray record far ahead is refused) — and the newest record's
frontier names the committed payload of every fragment (or, for
``align(..., round=r)``, round ``r``'s record, read directly). Those ``P`` payloads
are fetched, checked against their digests, decoded and written into the
model. A record that exists but does not decode stops the walk: the tape
cannot be skipped, so the model is left at the last good commit and the
returned :class:`Checkpoint` says which one.

:func:`align` is the evaluation entry point (``gm_shell.align(model,
mailbox=url)``); :func:`newest_record` and :func:`load_frontier` are shared with
``Session.close``, which leaves the model at the newest commit the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from gm_core import auth, keys, tip
from gm_core.auth import Envelope
from gm_core.manifest import frozen_mismatch, schema_mismatch
from gm_core.numerics.arrays import F32
from gm_core.records import AlgorithmConfig, Manifest, PayloadRef, RoundRecord
from gm_core.tape import BadRecord, frontier_of, parse_head
from gm_shell import nodekeys
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError, payload_key
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.models import ModelAdapter, ModelError, adapt
from gm_shell.reads import Reader, read_json
from gm_shell.replica import Replica
from gm_shell.run import RunError, RunMismatchError, pinned_digest, read_manifest
from gm_shell.runkey import FROM_ENV, RunKey
from gm_shell.runkey import resolve as resolve_run_key
from gm_shell.stores import MailboxOptions
from gm_shell.tapereads import read_record

LOG = logging.getLogger("gm")


@attrs.frozen(kw_only=True)
class Checkpoint:
    """Which commit the model now holds: ``round`` -1 is the run's initial parameters."""

    round: int
    versions: tuple[int, ...]
    stopped_at: str = ""
    """Why the walk stopped before the tape's end (an unreadable record), if it did."""


async def newest_record(
    mailbox: Mailbox, envelope: Envelope, manifest: Manifest, held: RoundRecord | None = None
) -> tuple[RoundRecord | None, str]:
    """The newest record that chains to the tape (:mod:`gm_core.tip`), walking from the head
    hint, or from ``held`` (a record the caller already adopted) when the hint is not ahead
    of it; and why the walk stopped early at an unreadable record ("" when it did not)."""
    hint = parse_head(envelope, await read_json(mailbox, keys.head()))
    after_held = held is not None and hint <= held.round + 1
    w = tip.Walk(round=held.round + 1, held=held) if after_held and held else tip.walk(hint)
    while not w.done:
        prev = tip.prev(w, manifest)
        got = (await read_record(mailbox, envelope, manifest.config, w.round, prev)).record
        if isinstance(got, BadRecord):
            return w.held, f"round {w.round}: {got.reason}"
        w = tip.missing(w) if got is None else tip.found(w, manifest, got)
    for round_, why in w.refused:
        LOG.warning("record of round %d refused: %s", round_, why)
    return w.held, ""


Fetch = Callable[[int, PayloadRef], Awaitable[F32]]


async def load_frontier(manifest: Manifest, record: RoundRecord | None, fetch: Fetch) -> list[F32]:
    """The committed value of every fragment after ``record``, fetched in parallel."""
    frontier = frontier_of(manifest, record)
    return list(await asyncio.gather(*(fetch(f, fs.theta) for f, fs in enumerate(frontier))))


def align(
    model: Any,
    *,
    mailbox: str,
    round: int | None = None,
    options: MailboxOptions | None = None,
    run_key: RunKey = FROM_ENV,
    manifest_digest: str | None = None,
) -> Checkpoint:
    """Load the run's committed parameters into ``model`` (torch, MLX or JAX) and return.

    The newest commit, or with ``round`` the commit of that round (its payloads must
    still be in the bucket: closers keep the newest two cycles). The run's synchronized
    parameters are loaded whatever ``requires_grad`` says; its frozen ones must be the
    model's already (the same base), which is checked. ``run_key`` as for
    :class:`~gm_shell.Session` (the run's key; default from ``GM_RUN_KEY``);
    ``manifest_digest`` too (any other manifest raises :class:`ManifestPinError` before
    anything is loaded into ``model``).
    """
    run_auth = resolve_run_key(run_key, mailbox)
    pinned = pinned_digest(manifest_digest)
    loop = LoopThread("gm-align")
    box = Mailbox.open(mailbox, options=options)
    try:
        manifest = loop.run(read_manifest(box, run_auth, pinned))
        if manifest is None:
            raise RunError(f"{mailbox}: no run here (manifest.json is absent)")
        run_auth = nodekeys.reader(run_auth, manifest)
        envelope = auth.of_run(manifest, run_auth)
        adapter = _adapter_for(model, manifest, mailbox)
        reader = Reader(
            node="align",
            mailbox=box,
            codec=FragmentCodec(manifest, payload_key=payload_key(run_auth)),
            compute=asyncio.to_thread,
            emit=lambda event: LOG.warning("%s", event.describe()),
            clock=time.monotonic,
        )

        async def fetch(fragment: int, ref: PayloadRef) -> F32:
            return await reader.payload(fragment, Role.THETA, ref)

        async def read() -> tuple[RoundRecord | None, str, list[F32]]:
            if round is None:
                record, stopped = await newest_record(box, envelope, manifest)
            else:
                record = await _record_of(box, mailbox, envelope, manifest.config, round)
                stopped = ""
            return record, stopped, await load_frontier(manifest, record, fetch)

        try:
            record, stopped, values = loop.run(read())
        except UnusablePayloadError as error:
            which = "the newest commit" if round is None else f"round {round}"
            raise RunError(
                f"{mailbox}: a payload of {which} cannot be read ({error}); "
                "closers keep the newest two cycles of payloads"
            ) from error
    finally:
        loop.stop()
        box.close()
    Replica(adapter, manifest.plan).overwrite_all(values)
    frontier = frontier_of(manifest, record)
    return Checkpoint(
        round=-1 if record is None else record.round,
        versions=tuple(fs.version for fs in frontier),
        stopped_at=stopped,
    )


def _adapter_for(model: Any, manifest: Manifest, url: str) -> ModelAdapter:
    """The model's run tensors; raises RunMismatchError naming what differs from the run."""
    names = [t.name for t in manifest.schema]
    try:
        adapter = adapt(model, names)
    except ModelError:
        adapter = adapt(model, ".")  # every parameter: name what is missing or extra
    problems = schema_mismatch(adapter.schema(), manifest.schema)
    problems += frozen_mismatch(adapter.frozen(), manifest.frozen)
    if problems:
        raise RunMismatchError(f"{url}: the model differs from the run's: " + "; ".join(problems))
    return adapter


async def _record_of(
    box: Mailbox, url: str, envelope: Envelope, config: AlgorithmConfig, round_: int
) -> RoundRecord:
    parsed = (await read_record(box, envelope, config, round_)).record
    if parsed is None:
        raise RunError(f"{url}: round {round_} has no record (not committed, or not yet)")
    if isinstance(parsed, BadRecord):
        raise RunError(f"{url}: the record of round {round_} is unreadable: {parsed.reason}")
    return parsed
