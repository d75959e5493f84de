"""What the bucket says about a finished demo run: its round records, folded into figures.

Theory of operation
-------------------
The summary's protocol figures come from the tape, not from the processes'
own accounts, because the tape is the truth of the run: a round counts if its
record exists, a learner participated if a record accepted it. Records are read
in order by probing the one key expected next (the same walk a joining node
does), stopping at the first absent key. Tokens are what the accepted snapshots
say they trained since their previous sync of the same fragment, so summed over
a fragment's rounds they cover each learner's training once; over all rounds,
``P`` times — hence the division by ``fragments`` in :attr:`TapeFigures.merged_tokens`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs

from gm_core import auth, codec, keys
from gm_core.auth import Envelope
from gm_core.records import Manifest, RoundRecord, Snapshot
from gm_core.tape import BadRecord
from gm_shell.mailbox import Mailbox
from gm_shell.run import read_manifest
from gm_shell.runkey import FROM_ENV, resolve
from gm_shell.tapereads import read_record


async def _run(box: Mailbox) -> tuple[Manifest, Envelope] | None:
    """The demo's run: local, so open unless its nodes took a key from the environment."""
    run_auth = resolve(FROM_ENV, box.url)
    manifest = await read_manifest(box, run_auth)
    return None if manifest is None else (manifest, auth.of_run(manifest, run_auth))


async def _walk(box: Mailbox) -> tuple[list[RoundRecord], str]:
    records: list[RoundRecord] = []
    run = await _run(box)
    if run is None:
        return records, "no manifest"
    manifest, envelope = run
    while True:
        parsed = (await read_record(box, envelope, manifest.config, len(records))).record
        if parsed is None:
            return records, ""
        if isinstance(parsed, BadRecord):
            return records, f"round {parsed.round}: {parsed.reason}"
        records.append(parsed)


async def _snapshot_sizes(box: Mailbox, records: Sequence[RoundRecord]) -> list[int]:
    sizes: list[int] = []
    run = await _run(box)
    if run is None:
        return sizes
    for record in records:
        for who in (p.learner for p in record.participants):
            key = keys.snapshot(record.round, who)
            got = await box.get(key)
            body = None if got is None else run[1].open(key, got.data)
            if isinstance(body, bytes):
                sizes.append(codec.decode(Snapshot, body).payload.size)
    return sizes


def delta_bytes(url: str, records: Sequence[RoundRecord], fragments: int) -> float | None:
    """Mean size of a delta payload over the last full cycle whose snapshots are still there.

    Snapshots are swept behind the commit, so only the newest rounds keep theirs;
    the last ``2·fragments`` rounds are searched (a cycle covers every fragment, whose
    payloads differ in size). None when every snapshot has been swept.
    """
    with Mailbox.open(url) as box:
        sizes = asyncio.run(_snapshot_sizes(box, records[-2 * fragments :]))
    return sum(sizes) / len(sizes) if sizes else None


def read_rounds(url: str) -> tuple[list[RoundRecord], str]:
    """Every round record in order, and why the walk stopped early ('' if at the end)."""
    with Mailbox.open(url) as box:
        return asyncio.run(_walk(box))


@attrs.frozen(kw_only=True)
class TapeFigures:
    rounds: int
    learners: tuple[str, ...]
    """Every learner some record accepted."""
    participants_mean: float
    participants_min: int
    rejections: int
    merged_tokens: float
    """Training tokens that reached a commit, counted once per learner-step (see module doc)."""
    takeovers: int


def figures(records: Sequence[RoundRecord], fragments: int) -> TapeFigures:
    counts = [len(r.participants) for r in records] or [0]
    tokens = sum(p.tokens for r in records for p in r.participants)
    return TapeFigures(
        rounds=len(records),
        learners=tuple(sorted({p.learner for r in records for p in r.participants})),
        participants_mean=sum(counts) / len(counts),
        participants_min=min(counts),
        rejections=sum(len(r.rejections) for r in records),
        merged_tokens=tokens / fragments,
        takeovers=sum(1 for r in records if r.claim > 0),
    )
