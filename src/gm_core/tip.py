"""What a joining node adopts as the tape's tip: only a record that chains to the round before.

Theory of operation
-------------------
A node that holds record ``r - 1`` checks that the record of round ``r`` names it
(:func:`gm_core.tape.expected_prev`), so once a node holds one good record every
record after it is checked. A node that *joins* (a learner loading the model, a
closer booting) holds nothing: the head hint names a round, it reads that round's
record on its own merits and probes forward from there. Without more, a stray record
far ahead of the tape — a head rewritten to name it, another run's object copied
in, the "record 1,000 rounds ahead" of issue 12 — would be adopted whole: its model
loaded, its sweep mark trusted, a fork committed on top of it.

So in a chained run (spec/protocol.md §16.5.2) the tip a joining node found is
adopted only once it chains to a record of the round before: when the probe runs
past a tip that was read with nothing checked before it, the node steps back one
round, reads that round's record, and adopts the tip if it names it (one GET more
per join: the round past the tip, read empty before the step back, is not read again).
Otherwise the walk goes on from the record it read, which re-reads the
tip with the chain checked (so a tip that does not chain is reported by the usual
``record_rejected``), and a tip with no record at all before it is refused by name
and the probe starts over from the tape's start. Every step back lowers the round
of the record under check, and round 0 always chains to the manifest, so the check
ends; its cost is one round's reads per record an outsider placed below the tip.

Finding the tip is one search for every reader (:class:`Walk`): from the head
hint it gallops and bisects, so a hint that lags, or an outsider's garbage head,
costs ``O(log n)`` reads instead of a walk over the tape.

A node that *resumes* (it saved the round and digest of the last record it adopted
before it stopped) checks more: the tip it joined must descend from that record
(:class:`Descent`), one read per round it missed, following each record's ``prev``
down to the saved round. A tape that was replaced or forked under it while it was
away, or a stray chain it joined, is refused by name instead of trained on.

This is protection from accidents and strays in an open run, where an outsider who
reads the real tip can extend it with correctly chained records; in an authenticated
run only key holders write records at all.
"""

from __future__ import annotations

import attrs

from gm_core.records import Manifest, RoundRecord
from gm_core.tape import chain_digest, expected_prev


@attrs.frozen
class TipCheck:
    """A joining node's progress in checking the tip it found (§16.5.2)."""

    unchained: int = -1
    """The round of the record taken with nothing checked before it (-1: none)."""
    verifying: RoundRecord | None = None
    """The tip being checked: its predecessor's round is being read."""


def taken(
    check: TipCheck, manifest: Manifest, held: RoundRecord | None, record: RoundRecord
) -> tuple[TipCheck, RoundRecord]:
    """``record`` was read by a node that held ``held`` (checked against it when it is
    the round before: :func:`gm_core.tape.expected_prev`).

    Returns the check after it and the record the node now holds: the tip under check
    when ``record`` is its predecessor and the tip names it (the walk jumps back to the
    tip), else ``record`` itself.
    """
    tip = check.verifying
    if tip is not None and tip.round == record.round + 1 and tip.prev == chain_digest(record):
        return TipCheck(), tip
    checked = held is not None and held.round == record.round - 1
    unchained = manifest.chained and record.round > 0 and not checked
    return TipCheck(unchained=record.round if unchained else check.unchained), record


def step_back(check: TipCheck, tip: RoundRecord) -> TipCheck | None:
    """The probe ran past ``tip``: the check that reads its predecessor, or None when
    ``tip`` may be adopted (it was checked against the record before it, or needs none)."""
    if tip.round != check.unchained:
        return None
    return TipCheck(verifying=tip)


def orphan(check: TipCheck, round_: int) -> tuple[int, str] | None:
    """The round of the tip under check and why it is refused, when round ``round_``
    turned out to hold no record (None: ``round_`` is not its predecessor's round, or
    nothing is under check)."""
    tip = check.verifying
    if tip is None or round_ != tip.round - 1:
        return None
    return tip.round, STRAY.format(before=round_)


STRAY = "does not chain: no record of round {before} precedes it (a stray record)"
"""Why a record with nothing at the round before it is refused (format with ``before``)."""


@attrs.frozen
class Walk:
    """Finding the tape's tip from a hint: the joining rule as a value, for the machines
    (a joining learner, a booting closer) and the one-shot readers (``align()``,
    ``Session.close``) alike.

    Read round :attr:`round`'s record checked against :func:`prev`, then feed
    :func:`found` or :func:`missing` until :attr:`done`; :attr:`held` is then the tip
    (None: the tape is empty). From a record found, the walk gallops (the next probes
    are 1, 1, 2, 4, ... rounds further) until a round holds nothing, then bisects the
    last gap: records are a prefix of the rounds, so a tip ``n`` rounds past the hint
    costs ``O(log n)`` reads — a hint that lags, or is garbage (the walk starts at
    round 0), costs logarithmic time, never a walk over the tape. The tip is adopted
    as :class:`TipCheck` says; a stray it refuses bounds the search below it.
    """

    round: int
    held: RoundRecord | None = None
    hint: int = -1
    """The round the head hint named (-1: none): its record is likely the tip."""
    check: TipCheck = attrs.field(factory=TipCheck)
    absent: int | None = None
    """The lowest round known to hold no usable record: the tip is below it."""
    stride: int = 0
    """How far past :attr:`held` the next probe goes while no gap is known."""
    refused: tuple[tuple[int, str], ...] = ()
    """Tips refused as strays: (round, why)."""
    done: bool = False


def walk(hint: int) -> Walk:
    """A walk that starts at the round the head hint names (-1: no hint, the tape's start)."""
    return Walk(round=max(hint, 0), hint=hint)


def prev(w: Walk, manifest: Manifest) -> str | None:
    """What the record of :attr:`Walk.round` must name (None: nothing is checked)."""
    return expected_prev(manifest, w.held, w.round)


def found(w: Walk, manifest: Manifest, record: RoundRecord) -> Walk:
    """The round's record, valid and chained as :func:`prev` asked: probe further."""
    check, held = taken(w.check, manifest, w.held, record)
    if held is not record:  # the tip under check chains to its predecessor: adopt it
        return _probe(attrs.evolve(w, held=held, check=check, stride=0))
    stride = max(w.stride * 2, 1) if w.absent is None else w.stride
    return _probe(attrs.evolve(w, held=held, check=check, stride=stride))


def missing(w: Walk) -> Walk:
    """The round holds no usable record: search below it, or check the tip found."""
    stray = orphan(w.check, w.round)
    if stray is not None:  # the tip under check has no predecessor: search below it
        return _probe(Walk(round=0, absent=stray[0], refused=(*w.refused, stray)))
    return _probe(attrs.evolve(w, absent=w.round if w.absent is None else min(w.absent, w.round)))


def _probe(w: Walk) -> Walk:
    """The next round to read, or the tip's check once the gap is closed."""
    present = -1 if w.held is None else w.held.round
    if w.absent is None:
        return attrs.evolve(w, round=present + max(w.stride, 1))
    if w.absent - present > 1:
        return attrs.evolve(w, round=(present + w.absent) // 2)
    back = None if w.held is None else step_back(w.check, w.held)
    if w.held is not None and back is not None:  # the gap above the tip stays known
        return Walk(round=w.held.round - 1, check=back, absent=w.absent, refused=w.refused)
    return attrs.evolve(w, check=TipCheck(), done=True)


@attrs.frozen
class Descent:
    """Whether a record descends from one adopted earlier (a resumed node, §16.5.2).

    Read round :attr:`round`'s record (the lowest valid slot, as every reader takes it)
    and feed :func:`descended` until :attr:`done`; :attr:`broken` then says why the
    record does not descend (None: it does). Each record read must be the one the
    record above it names as ``prev``; the walk ends at the saved round, whose record
    must have the saved digest.
    """

    since: int
    """The round of the record adopted earlier."""
    digest: str
    """Its :func:`gm_core.tape.chain_digest`."""
    round: int
    """The round to read next."""
    expect: str | None = None
    """The digest the record of :attr:`round` must have (the ``prev`` of the one above)."""
    broken: str | None = None
    done: bool = False


def descent(record: RoundRecord, since: int, digest: str) -> Descent:
    """Start checking that ``record`` descends from the record of round ``since`` whose
    digest is ``digest``."""
    if record.round < since:
        why = f"the tape's newest record is round {record.round}, before round {since}"
        return Descent(since=since, digest=digest, round=since, broken=why, done=True)
    start = Descent(since=since, digest=digest, round=record.round, expect=chain_digest(record))
    return descended(start, record)


def descended(d: Descent, record: RoundRecord | None) -> Descent:
    """The record of :attr:`Descent.round` (None: the round holds no usable record)."""
    if d.done:
        return d
    if record is None or record.round != d.round:
        return attrs.evolve(d, broken=f"round {d.round} has no record", done=True)
    if chain_digest(record) != d.expect:
        why = f"round {d.round}'s record is not the one round {d.round + 1} names"
        return attrs.evolve(d, broken=why, done=True)
    if record.round == d.since:
        adopted = chain_digest(record) == d.digest
        broken = None if adopted else f"round {d.since}'s record is not the one this node adopted"
        return attrs.evolve(d, broken=broken, done=True)
    if record.prev is None:
        why = f"round {d.round}'s record names no predecessor (the run is not chained)"
        return attrs.evolve(d, broken=why, done=True)
    return attrs.evolve(d, round=d.round - 1, expect=record.prev)
