"""``gm migrate OLD NEW``: a format-1 run's newest model as the start of a format-2 run.

Theory of operation
-------------------
A run has one wire format, its manifest's, for its whole life (spec/protocol.md §16.7):
format-1 objects in a format-2 run are refused by name, and a running run is never
rewritten in place (every node would have to agree on the moment). So a run moves to
format 2 only as a new run: this reads OLD as any reader does (``align()``'s walk to the
newest record that chains, the payloads bounded and checked against their digests) and
creates at NEW an authenticated format-2 run with the same config, schema, plan and
frozen tensors, whose initial state is OLD's newest commit — each fragment's theta and its
outer momentum — re-written under NEW's keyed payload digests, and with OLD's roster
(per-node keys) unless another is given. So the outer optimizer keeps its momentum
instead of starting afresh (which would restart the outer loop, not move it), and the
nodes that held keys in OLD hold them in NEW. The manifest's ``created_by`` is
``gm-migrate``.

Not carried, on purpose: versions (they count the commits of *this* run's tape, and
every reader bounds a record's version by its round, ``tape.implausible``: a carried
count would need that protocol rule to read the manifest, for nothing a node uses — a
snapshot's staleness is judged against versions of the same run, which start at 0 for
every node of NEW alike); OLD's records (NEW's tape starts empty, so its estimates start
unmeasured, as in any new run); members admitted or revoked under OLD's ``members/``
(the authority writes them again, or puts them on the new roster); learners' in-flight
deltas and resume state (they join NEW afresh).

OLD is read open unless a key is given for it (a run created authenticated before format
2: ``gm/2`` envelopes with format-1 bodies); NEW needs the run key every node of the new
run will hold. Nothing is written to OLD, and nothing to NEW unless no run is there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import attrs

from gm_core import auth
from gm_core.auth import RunAuth
from gm_core.numerics.arrays import F32
from gm_core.records import Manifest, PayloadRef, Roster
from gm_core.tape import frontier_of
from gm_shell import nodekeys
from gm_shell.align import load_frontier, newest_record
from gm_shell.fragments import FragmentCodec, Role, payload_key
from gm_shell.mailbox import Mailbox
from gm_shell.reads import Reader
from gm_shell.run import RunError, create, draft_manifest, read_manifest

LOG = logging.getLogger("gm")

MIGRATOR = "gm-migrate"
"""The node id a migrated manifest names as its creator."""


@attrs.frozen(kw_only=True)
class Migrated:
    """What ``gm migrate`` did: the round of OLD it started NEW from (-1: OLD's initial
    parameters, no record yet) and NEW's manifest."""

    round: int
    manifest: Manifest
    stopped_at: str = ""
    """Why the walk to OLD's newest record stopped early (an unreadable record), if it did."""


async def migrate(
    old: Mailbox,
    new: Mailbox,
    new_auth: RunAuth,
    *,
    old_auth: RunAuth | None = None,
    run_id: str | None = None,
    roster: Roster | None = None,
) -> Migrated:
    """Create at ``new`` a format-2 run starting from ``old``'s newest commit."""
    manifest = await read_manifest(old, old_auth)
    if manifest is None:
        raise RunError(f"{old.url}: no run here (manifest.json is absent)")
    if await read_manifest(new, new_auth) is not None:  # refuses another mode's, by name
        raise RunError(f"{new.url}: a run is already there; migrate into an empty prefix")
    reading = nodekeys.reader(old_auth, manifest)
    envelope = auth.of_run(manifest, reading)
    reader = Reader(
        node=MIGRATOR,
        mailbox=old,
        codec=FragmentCodec(manifest, payload_key=payload_key(reading)),
        compute=asyncio.to_thread,
        emit=lambda event: LOG.warning("%s", event.describe()),
        clock=time.monotonic,
    )

    async def fetch(fragment: int, ref: PayloadRef) -> F32:
        return await reader.payload(fragment, Role.THETA, ref)

    async def fetch_momentum(fragment: int, ref: PayloadRef | None) -> F32 | None:
        return None if ref is None else await reader.payload(fragment, Role.MOMENTUM, ref)

    record, stopped = await newest_record(old, envelope, manifest)
    values = await load_frontier(manifest, record, fetch)
    frontier = frontier_of(manifest, record)
    momenta = await asyncio.gather(
        *(fetch_momentum(f, state.momentum) for f, state in enumerate(frontier))
    )
    draft = draft_manifest(
        run_id=run_id or uuid.uuid4().hex[:12],
        node=MIGRATOR,
        config=manifest.config,
        schema=manifest.schema,
        frozen=manifest.frozen,
        run_auth=new_auth,
        roster=manifest.roster if roster is None else roster,
    )
    if draft.plan != manifest.plan:
        raise RunError(
            f"{old.url}: its fragment plan is not the one this gm makes of its config and "
            "schema (it was created by another gm version): its fragments cannot be carried over"
        )
    created = await create(new, draft, values, new_auth, momenta=momenta)
    if created is None:
        raise RunError(f"{new.url}: another run's manifest was written there meanwhile")
    round_ = -1 if record is None else record.round
    return Migrated(round=round_, manifest=created, stopped_at=stopped)
