"""``gm status URL``: what a run's tape says, read cheaply from any mailbox.

Theory of operation
-------------------
Everything worth knowing about a run is in its manifest and its round records,
and the newest record carries the frontier (every fragment's version), the
timing EMAs and the run's request total, so a status needs the manifest, the
newest record and a short window of records before it — never the whole tape
(``--all`` asks for that explicitly). Reading writes nothing and needs no lease.

Finding the newest round uses the tape's shape: records are create-once and
written strictly in order, so they always form a prefix ``0..n-1`` of the rounds
(:mod:`gm_core.tape`). The ``head.json`` hint names a recent record; from there
the reader gallops forward (``h+1, h+2, h+4, …``) until a key is missing and
bisects the last gap, which in the usual case (the hint is current) costs one
hit and one miss, like the learner's forward probe. Without a usable hint, or
when the hint leads the tape, the same search starts from round -1 and costs
O(log n) GETs instead of a walk over every record. Existence is what the
search asks, so a malformed record still counts as written; each probe is a
GET (billed like a HEAD) and its bytes are kept for the window.

The window (``--last N`` records ending at the newest) is then read in parallel
chunks and folded into counters one record at a time, so ``--all`` on a long
tape holds one record at a time, not the tape. A record that does not decode is
named with the codec's reason and skipped: unlike a learner, which must stop at
the first unusable commit, a reader can look past it. The summary is a frozen
:class:`RunStatus`; :func:`format_status` renders it for people and
:func:`to_json`/:func:`from_json` for programs. The requests the status itself
made are taken from the mailbox's meter at the end and reported with it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import cattrs

from gm_core import auth, keys, schedule, timing, tip
from gm_core.auth import Envelope, RunAuth, Signing
from gm_core.completion import Summary, judge_summary
from gm_core.manifest import digest
from gm_core.records import AlgorithmConfig, Alignment, Manifest, Requests, RoundRecord
from gm_core.tape import BadRecord, expected_prev, parse_head
from gm_shell import events, members, nodekeys
from gm_shell.accounting import PRICES_R2, PRICES_S3, PriceTable, Stats, cost_usd
from gm_shell.mailbox import Mailbox
from gm_shell.reads import read_json
from gm_shell.run import RunError, find_manifest
from gm_shell.runkey import remote
from gm_shell.stores import MailboxOptions, local_path
from gm_shell.tapereads import SlotRead, read_record

DEFAULT_LAST = 20
"""Records summarized by default (the newest and the ones before it)."""

READ_CHUNK = 32
"""Records fetched at once while reading the window (the mailbox's default concurrency)."""

RECENT_REJECTIONS = 20
"""Rejections listed one by one (the newest ones in the window); all are counted."""

RECENT_SHOWN = 5
"""Of those, how many the human summary prints."""

PRICES: dict[str, PriceTable] = {"s3": PRICES_S3, "r2": PRICES_R2}
"""Price tables ``--prices`` can name."""


MAX_MEMBERS_SHOWN = 8
"""Roster members the human summary names before it counts the rest."""


class NoRunError(RunError):
    """The URL holds no run (no folder, or no manifest)."""


# --- the summary ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Unreadable:
    """A round record that exists but cannot be used; ``reason`` is the codec's."""

    round: int
    reason: str


@attrs.frozen(kw_only=True)
class FragmentRow:
    """One fragment as the newest readable record's frontier has it."""

    fragment: int
    version: int
    tensors: int
    theta_bytes: int
    theta_key: str
    momentum: bool
    last_round: int | None
    """Newest round in the window that synced this fragment (None: not in the window)."""


@attrs.frozen(kw_only=True)
class LearnerTally:
    """One learner over the window: accepted contributions and rejections."""

    learner: str
    rounds: int
    steps: int
    """Steps whose work reached a commit: the accepted snapshots' steps over ``P``.

    A snapshot counts the steps since its fragment's anchor, so every step a learner
    trains is reported once per fragment; the sum over the window divided by ``P``
    counts it once (with ``carry`` and no rejections, what the learner trained)."""
    tokens: int
    """Samples or tokens (the run's ``config.unit``; the records' field name) whose work
    reached a commit, counted like ``steps``."""
    rejected: int
    last_round: int


@attrs.frozen(kw_only=True)
class Count:
    name: str
    count: int


@attrs.frozen(kw_only=True)
class RejectionAt:
    round: int
    learner: str
    reason: str


@attrs.frozen(kw_only=True)
class Takeover:
    """A round closed by a node that claimed it (``claim`` > 0), not the one named."""

    round: int
    closer: str
    claim: int


@attrs.frozen(kw_only=True)
class Window:
    """The records from ``first_round`` to ``last_round``, summarized."""

    first_round: int
    last_round: int
    records: int
    """Readable records in the window (the unreadable ones are listed in RunStatus)."""
    empty_rounds: int
    """Rounds that committed nothing new (no participant)."""
    mean_participants: float | None
    learners: tuple[LearnerTally, ...]
    rejections: tuple[Count, ...]
    """By reason, most frequent first."""
    recent_rejections: tuple[RejectionAt, ...]
    closers: tuple[Count, ...]
    takeovers: tuple[Takeover, ...]
    mean_quorum_s: float | None
    mean_grace_s: float | None
    mean_cosine: float | None


@attrs.frozen(kw_only=True)
class Newest:
    """The newest readable record, in brief."""

    round: int
    step: int
    fragment: int
    version: int
    participants: int
    closer: str
    claim: int
    next_closer: str
    swept_below: int


@attrs.frozen(kw_only=True)
class Estimates:
    """The newest record's timing EMAs and the waits they size for the next round."""

    step_s: float | None
    quorum_s: float | None
    sync_s: float | None
    next_round: int
    gap_steps: int
    round_s: float | None
    """About ``gap·ξ_step``: how often a round is due, paced by the learners."""
    grace_s: float
    """The grace window the next round's closer would grant after quorum."""
    takeover_timeout_s: float
    """How long followers wait for the next record before claiming the round."""


@attrs.frozen(kw_only=True)
class Cost:
    """The run's store requests through the newest record, priced."""

    through_round: int
    requests: Requests
    reported: bool
    """False while every count is zero (nodes that do not account requests yet)."""
    prices: str
    usd: float
    usd_per_round: float


@attrs.frozen(kw_only=True)
class RunStatus:
    url: str
    run_id: str
    created_by: str
    config: AlgorithmConfig
    tensors: int
    parameters: int
    head_hint: int
    """The round ``head.json`` names, -1 when it is absent or unreadable."""
    rounds: int
    """Records on the tape: the newest round is ``rounds - 1``."""
    newest: Newest | None
    frontier: tuple[FragmentRow, ...]
    """From the newest readable record; the manifest's initial state before round 0."""
    window: Window | None
    estimates: Estimates | None
    cost: Cost | None
    unreadable: tuple[Unreadable, ...]
    status_requests: Stats
    """What reading this status cost (the mailbox's meter)."""
    status_usd: float
    prices: str
    auth: str = "open"
    """"open", or the key id an authenticated run's objects are tagged under."""
    finished: Summary | None = None
    """What ``finished.json`` says (None: the run is not finished, or it is unreadable)."""
    finished_problem: str = ""
    """Why a ``finished.json`` that is there was not believed."""
    manifest_digest: str = ""
    """The manifest's digest (:func:`gm_core.manifest.digest`): what a node pins with
    ``manifest_digest=`` to join this run and no other (trust on first use)."""
    format: int = 1
    """The run's wire format (its manifest's, spec/protocol.md §16.7): 2 for runs created by
    this gm, 1 for runs created before (open, or authenticated before format 2)."""
    members: tuple[str, ...] = ()
    """Per-node keys (spec/protocol.md §16.3): the roster's members as ``id:roles``
    (empty: the run key alone, or an open run)."""
    authority: str = ""
    """The public key of the roster's authority (empty: no roster)."""
    certified: tuple[str, ...] = ()
    """Members the authority admitted since the manifest (``members/``, protocol §16.3.3),
    as ``id:roles``; also in :attr:`members`."""
    revoked: tuple[str, ...] = ()
    """Members the authority revoked, as ``id from round R``."""
    members_refused: int = 0
    """Objects under ``members/`` that are not the authority's word (or cannot count)."""


# --- reading -------------------------------------------------------------------------


def open_mailbox(url: str, options: MailboxOptions | None = None) -> Mailbox:
    """A mailbox for ``url``; a ``file://`` folder must already exist (status creates nothing)."""
    folder = local_path(url)
    if folder is not None and not folder.is_dir():
        raise NoRunError(f"{url}: no run here (no folder {folder})")
    return Mailbox.open(url, options=options)


T = TypeVar("T")


async def _written(
    box: Mailbox, envelope: Envelope, config: AlgorithmConfig, round_: int
) -> SlotRead | None:
    """What round ``round_``'s key holds; None when nothing is there (the tape ends before).

    Objects the slot rule skips count as written here: an operator's status names
    them as unreadable (an overwritten record, garbage) instead of ending the tape.
    """
    got = await read_record(box, envelope, config, round_)
    return None if got.record is None and not got.skipped else got


async def _probe(
    read: Callable[[int], Awaitable[T | None]], seen: dict[int, T], round_: int
) -> bool:
    """Whether round ``round_``'s record is written (read once: kept in ``seen``)."""
    got = seen.get(round_) or await read(round_)
    if got is not None:
        seen[round_] = got
    return got is not None


async def tape_length(
    read: Callable[[int], Awaitable[T | None]],
    hint: int,
    seen: dict[int, T],
    below: int = keys.ROUND_LIMIT,
) -> int:
    """How many records the tape holds (the newest round plus one); fills ``seen``.

    Gallops forward from the hint and bisects, relying on records being a prefix
    of the rounds. ``read`` reads one round's record (None: not written); each one
    found goes into ``seen`` so the window does not read it again. Rounds from
    ``below`` on count as not written (a stray record found there before).
    """

    written = functools.partial(_probe, read, seen)
    present = -1  # a round known written (-1: none yet)
    absent: int | None = None  # a round known missing
    if hint >= below:
        absent = below
    elif hint >= 0:
        if await written(hint):
            present = hint
        else:
            absent = hint  # the hint leads the tape (it should not): search below it
    stride = 1
    while absent is None:
        candidate = present + stride
        if candidate >= below:
            absent = below
        elif await written(candidate):
            present, stride = candidate, stride * 2
        else:
            absent = candidate
    while absent - present > 1:
        middle = (present + absent) // 2
        if await written(middle):
            present = middle
        else:
            absent = middle
    return absent


@attrs.define
class _Tally:
    """Counters folded one record at a time (the window may be the whole tape)."""

    records: int = 0
    empty: int = 0
    participants: int = 0
    steps: Counter[str] = attrs.field(factory=Counter)
    tokens: Counter[str] = attrs.field(factory=Counter)
    accepted: Counter[str] = attrs.field(factory=Counter)
    rejected: Counter[str] = attrs.field(factory=Counter)
    last_seen: dict[str, int] = attrs.field(factory=dict)
    reasons: Counter[str] = attrs.field(factory=Counter)
    recent: list[RejectionAt] = attrs.field(factory=list)
    closers: Counter[str] = attrs.field(factory=Counter)
    takeovers: list[Takeover] = attrs.field(factory=list)
    quorum_s: float = 0.0
    grace_s: float = 0.0
    cosine_sum: float = 0.0
    cosines: int = 0
    synced: dict[int, int] = attrs.field(factory=dict)
    newest: RoundRecord | None = None

    def add(self, record: RoundRecord) -> None:
        self.records += 1
        self.newest = record
        self.participants += len(record.participants)
        if record.participants:
            self.synced[record.fragment] = record.round
        else:
            self.empty += 1
        for p in record.participants:
            self.accepted[p.learner] += 1
            self.steps[p.learner] += p.steps
            self.tokens[p.learner] += p.tokens
            self.last_seen[p.learner] = record.round
        for j in record.rejections:
            self.rejected[j.learner] += 1
            self.last_seen[j.learner] = record.round
            self.reasons[j.reason.value] += 1
            self.recent.append(
                RejectionAt(round=record.round, learner=j.learner, reason=j.reason.value)
            )
        del self.recent[:-RECENT_REJECTIONS]
        self.closers[record.closer] += 1
        if record.claim > 0:
            self.takeovers.append(
                Takeover(round=record.round, closer=record.closer, claim=record.claim)
            )
        self.quorum_s += record.quorum_s
        self.grace_s += record.grace_s
        if record.cosine is not None:
            self.cosine_sum += record.cosine
            self.cosines += 1

    def window(self, first: int, last: int, fragments: int) -> Window:
        n = self.records
        learners = tuple(
            LearnerTally(
                learner=name,
                rounds=self.accepted[name],
                steps=round(self.steps[name] / fragments),
                tokens=round(self.tokens[name] / fragments),
                rejected=self.rejected[name],
                last_round=self.last_seen[name],
            )
            for name in sorted(self.last_seen)
        )
        return Window(
            first_round=first,
            last_round=last,
            records=n,
            empty_rounds=self.empty,
            mean_participants=self.participants / n if n else None,
            learners=learners,
            rejections=_counts(self.reasons),
            recent_rejections=tuple(self.recent),
            closers=_counts(self.closers),
            takeovers=tuple(self.takeovers),
            mean_quorum_s=self.quorum_s / n if n else None,
            mean_grace_s=self.grace_s / n if n else None,
            mean_cosine=self.cosine_sum / self.cosines if self.cosines else None,
        )


def _counts(counter: Counter[str]) -> tuple[Count, ...]:
    ordered = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    return tuple(Count(name=name, count=n) for name, n in ordered)


async def read_window(
    box: Mailbox,
    envelope: Envelope,
    manifest: Manifest,
    first: int,
    end: int,
    seen: dict[int, SlotRead],
) -> tuple[_Tally, list[Unreadable]]:
    """Fold records ``first..end-1`` into a tally, in round order; name the unreadable.

    In a chained run a record that does not name the one before it is what the nodes
    skipped (spec/protocol.md §16.5): it is named unreadable, and its round read again
    with the chain checked to find the record the nodes adopted."""
    tally = _Tally()
    unreadable: list[Unreadable] = []
    config, held = manifest.config, None
    for start in range(first, end, READ_CHUNK):
        rounds = range(start, min(start + READ_CHUNK, end))
        fetched = await asyncio.gather(
            *(
                _known(seen, r) if r in seen else read_record(box, envelope, config, r)
                for r in rounds
            )
        )
        for round_, got in zip(rounds, fetched, strict=True):
            seen.pop(round_, None)
            expected = expected_prev(manifest, held, round_)
            if isinstance(got.record, RoundRecord) and expected not in (None, got.record.prev):
                got = await read_record(box, envelope, config, round_, expected)
                chain = [b for b in got.skipped if b.reason.startswith("does not chain")]
                unreadable += [Unreadable(round=b.round, reason=b.reason) for b in chain]
            parsed = got.skipped[-1] if got.record is None and got.skipped else got.record
            if parsed is None:
                # Below the tape's end, so it was written: something deleted it.
                unreadable.append(Unreadable(round=round_, reason="record is missing"))
            elif isinstance(parsed, BadRecord):
                unreadable.append(Unreadable(round=parsed.round, reason=parsed.reason))
            else:
                tally.add(parsed)
            held = parsed if isinstance(parsed, RoundRecord) else None
    return tally, unreadable


async def _known(seen: dict[int, SlotRead], round_: int) -> SlotRead:
    return seen[round_]


def _estimates(config: AlgorithmConfig, record: RoundRecord) -> Estimates:
    """What the newest record's EMAs say about the next round (the closer's own formulas)."""
    nxt = record.round + 1
    gap = schedule.gap_of(nxt, config.sync_every, config.fragments)
    t = record.timing
    step_s = t.step_s if t.step_s is not None and math.isfinite(t.step_s) else None
    return Estimates(
        step_s=t.step_s,
        quorum_s=t.quorum_s,
        sync_s=t.sync_s,
        next_round=nxt,
        gap_steps=gap,
        round_s=None if step_s is None else gap * step_s,
        grace_s=timing.window_s(t, config, gap),
        takeover_timeout_s=timing.takeover_after_s(t, config, gap),
    )


def _cost(record: RoundRecord, prices: PriceTable) -> Cost:
    r = record.requests
    stats = Stats(
        list_requests=r.lists, get_requests=r.gets, put_requests=r.puts, delete_requests=r.deletes
    )
    usd = cost_usd(stats, prices)
    return Cost(
        through_round=record.round,
        requests=r,
        reported=r != Requests(),
        prices=prices.name,
        usd=usd,
        usd_per_round=usd / (record.round + 1),
    )


def _frontier(
    manifest: Manifest, record: RoundRecord | None, synced: dict[int, int]
) -> tuple[FragmentRow, ...]:
    states = manifest.init if record is None else record.frontier
    return tuple(
        FragmentRow(
            fragment=f,
            version=fs.version,
            tensors=len(manifest.plan.fragments[f]) if f < len(manifest.plan.fragments) else 0,
            theta_bytes=fs.theta.size,
            theta_key=fs.theta.key,
            momentum=fs.momentum is not None,
            last_round=synced.get(f),
        )
        for f, fs in enumerate(states)
    )


async def gather_status(
    box: Mailbox,
    *,
    last: int = DEFAULT_LAST,
    everything: bool = False,
    prices: PriceTable = PRICES_S3,
    run_auth: RunAuth | None = None,
    pinned: str | None = None,
) -> RunStatus:
    """Read the manifest, find the newest round and summarize the last ``last`` records.

    ``run_auth``: the run key's subkeys, needed to read an authenticated run. ``pinned``:
    a manifest digest; any other manifest raises :class:`~gm_shell.run.ManifestPinError`.

    Raises :class:`NoRunError` when there is no manifest, :class:`RunError` when it
    is unreadable, and :class:`~gm_shell.mailbox.MailboxError` when the store fails.
    """
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    before = box.stats
    found = await find_manifest(box, run_auth, pinned)
    manifest = found.manifest
    if manifest is None and found.skipped:
        skipped = "; ".join(found.skipped)
        raise NoRunError(f"{box.url}: no run here (no manifest this node can use: {skipped})")
    if manifest is None:
        raise NoRunError(f"{box.url}: no run here (manifest.json is absent)")
    run_auth = nodekeys.reader(run_auth, manifest)
    refused: tuple[events.Event, ...] = ()
    signing = None if run_auth is None else run_auth.signing
    if run_auth is not None and signing is not None:  # what members/ adds
        signing, refused = await members.learn_all(box, run_auth, manifest)
        run_auth = attrs.evolve(run_auth, signing=signing)
    envelope = auth.of_run(manifest, run_auth)
    hint = parse_head(envelope, await read_json(box, keys.head()))
    seen: dict[int, SlotRead] = {}
    written = functools.partial(_written, box, envelope, manifest.config)
    rounds = await tape_length(written, hint, seen)
    strays: list[Unreadable] = []
    # A chained run's tip with no record before it is a stray (gm_core.tip): look below it.
    while manifest.chained and rounds > 1 and not await _probe(written, seen, rounds - 2):
        strays.append(Unreadable(round=rounds - 1, reason=tip.STRAY.format(before=rounds - 2)))
        rounds = await tape_length(written, -1, seen, below=rounds - 1)
    first = 0 if everything else max(rounds - last, 0)
    tally, unreadable = await read_window(box, envelope, manifest, first, rounds, seen)
    unreadable += strays
    newest = tally.newest
    config = manifest.config
    if rounds == 0:
        frontier = _frontier(manifest, None, tally.synced)
    else:  # the newest readable record's, none if the whole window is unreadable
        frontier = () if newest is None else _frontier(manifest, newest, tally.synced)
    finished, finished_problem = _finished(envelope, await read_json(box, keys.finished()))
    spent = box.stats - before
    return RunStatus(
        finished=finished,
        finished_problem=finished_problem,
        url=box.url,
        run_id=manifest.run_id,
        created_by=manifest.created_by,
        auth="open" if manifest.auth is None else f"key id {manifest.auth.key_id}",
        manifest_digest=digest(manifest),
        format=manifest.format,
        members=tuple(
            f"{m.node}:{'+'.join(m.roles)}"
            for m in (manifest.roster.members if manifest.roster else ())
        )
        + _certified(signing),
        authority="" if manifest.roster is None else manifest.roster.authority,
        certified=_certified(signing),
        revoked=tuple(f"{n} from round {r}" for n, r in (signing.revoked if signing else ())),
        members_refused=sum(isinstance(e, events.MemberRefused) for e in refused),
        config=config,
        tensors=len(manifest.schema),
        parameters=sum(math.prod(t.shape) for t in manifest.schema),
        head_hint=hint,
        rounds=rounds,
        newest=None if newest is None else _newest(newest),
        frontier=frontier,
        window=tally.window(first, rounds - 1, config.fragments) if rounds else None,
        estimates=None if newest is None else _estimates(config, newest),
        cost=None if newest is None else _cost(newest, prices),
        unreadable=tuple(unreadable),
        status_requests=spent,
        status_usd=cost_usd(spent, prices),
        prices=prices.name,
    )


def _certified(signing: Signing | None) -> tuple[str, ...]:
    return tuple(f"{m.node}:{'+'.join(m.roles)}" for m in (signing.certified if signing else ()))


def _finished(envelope: Envelope, data: bytes | None) -> tuple[Summary | None, str]:
    """The run's finished summary, or why the object there is not believed."""
    if data is None:
        return None, ""
    summary = judge_summary(envelope, data)
    return (None, summary) if isinstance(summary, str) else (summary, "")


def _newest(record: RoundRecord) -> Newest:
    return Newest(
        round=record.round,
        step=record.step,
        fragment=record.fragment,
        version=record.version,
        participants=len(record.participants),
        closer=record.closer,
        claim=record.claim,
        next_closer=record.next_closer,
        swept_below=record.swept_below,
    )


# --- output --------------------------------------------------------------------------

_converter = cattrs.Converter()


def to_json(status: RunStatus) -> str:
    """The status as a JSON document (what ``gm status --json`` prints)."""
    return json.dumps(_converter.unstructure(status), indent=2, sort_keys=True)


def from_json(text: str) -> RunStatus:
    """The inverse of :func:`to_json`."""
    return _converter.structure(json.loads(text), RunStatus)


def _s(value: float | None) -> str:
    """A duration in seconds for people: 3 significant digits, ``-`` when unknown."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f} s"
    return f"{value:.3g} s"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _usd(value: float) -> str:
    return f"${value:.4f}" if value >= 0.01 else f"${value:.2g}"


def _requests_line(lists: int, gets: int, puts: int, deletes: int) -> str:
    return f"{lists:,} LIST, {gets:,} GET, {puts:,} PUT, {deletes:,} DELETE"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str) -> list[str]:
    cells = [[str(h) for h in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        indent
        + "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]


def _auth_line(s: RunStatus) -> str:
    if s.auth != "open":
        return f"authenticated ({s.auth}): objects without the run key's tag are refused"
    if remote(s.url):
        return (
            "OPEN: objects are not authenticated; anyone who can write here can replace the model"
        )
    return "open (a local run: objects are not authenticated)"


def _roster_line(s: RunStatus) -> str:
    named = ", ".join(s.members[:MAX_MEMBERS_SHOWN])
    hidden = len(s.members) - MAX_MEMBERS_SHOWN
    more = f" and {hidden} more" if hidden > 0 else ""
    line = f"per-node keys: {len(s.members)} members ({named}{more}); authority {s.authority}"
    if s.certified:
        line += f"; {len(s.certified)} admitted under members/"
    if s.revoked:
        shown = ", ".join(s.revoked[:MAX_MEMBERS_SHOWN])
        line += f"; revoked: {shown}" + (" ..." if len(s.revoked) > MAX_MEMBERS_SHOWN else "")
    if s.members_refused:
        line += f"; {_n(s.members_refused, 'object')} under members/ refused"
    return line


def format_status(s: RunStatus) -> str:
    """The human summary ``gm status`` prints."""
    c = s.config
    out: list[str] = []
    out.append(f"run      {s.run_id} (created by {s.created_by})  {s.url}")
    out.append(f"auth     {_auth_line(s)}")
    out.append(
        f"manifest {s.manifest_digest} (nodes pin it with manifest_digest=); wire format {s.format}"
    )
    if s.members:
        out.append(f"roster   {_roster_line(s)}")
    mixing = f" mixing={c.mixing:g}" if c.alignment is Alignment.BLEND else ""
    if c.alignment is Alignment.ADAPTIVE:
        mixing = f" carry_above={c.carry_above:g} overwrite_below={c.overwrite_below:g}"
    overlap = "" if c.overlap_steps is None else f" overlap_steps={c.overlap_steps}"
    if c.follow:
        overlap += f" follow={c.follow}"
    out.append(
        f"config   H={c.sync_every} P={c.fragments} quorum={c.quorum} in_flight={c.in_flight}"
        f"{overlap} merge={c.merge.value} alignment={c.alignment.value}{mixing}"
        f" outer_lr={c.outer_lr:g} outer_momentum={c.outer_momentum:g}"
    )
    out.append(
        f"         delta {c.delta_format.value}, commit {c.commit_format.value},"
        f" compression {c.compression.value}; {s.tensors} tensors, {s.parameters:,} parameters;"
        f" lease timeout {_s(c.lease_timeout_s)}"
    )
    if s.finished is not None:
        f = s.finished
        out.append(
            f"state    finished at round {f.round} (found by {f.by}): {_n(f.slices, 'slice')} of"
            f" data done, {f.steps:,} steps, {f.tokens:,} {c.unit.value} trained (each once)"
        )
    elif s.finished_problem:
        out.append(f"state    running; finished.json refused: {s.finished_problem}")
    hint = "none" if s.head_hint < 0 else str(s.head_hint)
    n = s.newest
    if s.rounds == 0:
        out.append(f"tape     no rounds committed yet (head hint {hint})")
    else:
        out.append(f"tape     {s.rounds:,} rounds (0..{s.rounds - 1}), head hint {hint}")
    if n is not None:
        how = "named by the previous record" if n.claim == 0 else f"took over via claim {n.claim}"
        out.append(
            f"newest   round {n.round} at step {n.step}: fragment {n.fragment} -> version"
            f" {n.version}, {_n(n.participants, 'participant')}, closed by {n.closer} ({how});"
            f" next closer {n.next_closer}"
        )
        if n.round != s.rounds - 1:
            out.append(f"         (round {s.rounds - 1} is unreadable: see below)")
    elif s.rounds:
        out.append("newest   no readable record in the window")
    out.append("")
    source = "manifest (initial)" if s.rounds == 0 else f"round {n.round}" if n else "?"
    out.append(f"fragments (frontier of {source})")
    out.extend(
        _table(
            ("fragment", "version", "last synced", "tensors", "bytes", "momentum"),
            [
                (
                    f.fragment,
                    f.version,
                    "-" if f.last_round is None else f"round {f.last_round}",
                    f.tensors,
                    f"{f.theta_bytes:,}",
                    "yes" if f.momentum else "no",
                )
                for f in s.frontier
            ],
            "  ",
        )
    )
    w = s.window
    if w is not None:
        out.append("")
        out.append(
            f"window   rounds {w.first_round}..{w.last_round} ({_n(w.records, 'readable record')})"
        )
        mean = "-" if w.mean_participants is None else f"{w.mean_participants:.2f}"
        out.append(
            f"  participants  {mean} per round, {_n(len(w.learners), 'learner')},"
            f" {_n(w.empty_rounds, 'empty round')}"
        )
        if w.learners:
            out.extend(
                _table(
                    (
                        "learner",
                        "rounds",
                        "steps committed",
                        f"{s.config.unit} committed",
                        "rejected",
                        "last round",
                    ),
                    [
                        (
                            t.learner,
                            t.rounds,
                            f"{t.steps:,}",
                            f"{t.tokens:,}",
                            t.rejected,
                            t.last_round,
                        )
                        for t in w.learners
                    ],
                    "    ",
                )
            )
        if w.rejections:
            total = sum(r.count for r in w.rejections)
            by = ", ".join(f"{r.name} {r.count}" for r in w.rejections)
            out.append(f"  rejections    {total}: {by}")
            shown = w.recent_rejections[::-1][:RECENT_SHOWN]
            recent = ", ".join(f"round {r.round} {r.learner} {r.reason}" for r in shown)
            more = len(w.recent_rejections) - len(shown)
            out.append(f"    newest: {recent}" + (f" (+{more} more in --json)" if more else ""))
        else:
            out.append("  rejections    none")
        out.append("  closers       " + ", ".join(f"{k.name} {k.count}" for k in w.closers))
        if w.takeovers:
            listed = ", ".join(f"round {t.round} {t.closer} (claim {t.claim})" for t in w.takeovers)
            out.append(f"  takeovers     {len(w.takeovers)}: {listed}")
        else:
            out.append("  takeovers     none")
        cosine = "" if w.mean_cosine is None else f", mean cosine {w.mean_cosine:.3f}"
        out.append(
            f"  waits         mean quorum {_s(w.mean_quorum_s)}, mean grace {_s(w.mean_grace_s)}"
            f"{cosine}"
        )
    e = s.estimates
    if e is not None and n is not None:
        out.append("")
        out.append(
            f"timing   EMAs of round {n.round}: step {_s(e.step_s)}, quorum {_s(e.quorum_s)},"
            f" sync {_s(e.sync_s)}"
        )
        every = "" if e.round_s is None else f", a round every ~{_s(e.round_s)}"
        out.append(
            f"         round {e.next_round}: gap {e.gap_steps} steps{every};"
            f" grace {_s(e.grace_s)}; takeover after {_s(e.takeover_timeout_s)} without a record"
        )
    k = s.cost
    if k is not None:
        r = k.requests
        if k.reported:
            out.append(
                f"requests run total through round {k.through_round}:"
                f" {_requests_line(r.lists, r.gets, r.puts, r.deletes)}"
            )
            out.append(
                f"         ≈ {_usd(k.usd)} at {k.prices} prices ({_usd(k.usd_per_round)} per round)"
            )
        else:
            out.append(
                f"requests not reported (round {k.through_round}'s record counts none:"
                " its nodes do not account requests)"
            )
    if s.unreadable:
        out.append("")
        out.append(f"unreadable records ({len(s.unreadable)}, skipped):")
        out.extend(f"  round {u.round}: {u.reason}" for u in s.unreadable)
    q = s.status_requests
    out.append("")
    out.append(
        f"this status: {q.total_requests:,} requests"
        f" ({_requests_line(q.list_requests, q.get_requests, q.put_requests, q.delete_requests)})"
        f" ≈ {_usd(s.status_usd)} at {s.prices} prices"
    )
    return "\n".join(out)
