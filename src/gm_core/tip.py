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
per join). Otherwise the walk goes on from the record it read, which re-reads the
tip with the chain checked (so a tip that does not chain is reported by the usual
``record_rejected``), and a tip with no record at all before it is refused by name
and the probe starts over from the tape's start. Every step back lowers the round
of the record under check, and round 0 always chains to the manifest, so the check
ends; its cost is one round's reads per record an outsider placed below the tip.

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
    """A one-shot reader's walk to the tip (``align()``, ``Session.close``): the machines'
    joining rule as a value. Read round :attr:`round`'s record checked against
    :func:`prev`, then feed :func:`found` or :func:`missing` until :attr:`done`."""

    round: int
    held: RoundRecord | None = None
    check: TipCheck = attrs.field(factory=TipCheck)
    refused: tuple[tuple[int, str], ...] = ()
    """Tips refused as strays: (round, why)."""
    done: bool = False


def walk(hint: int) -> Walk:
    """A walk that starts at the round the head hint names (-1: no hint, the tape's start)."""
    return Walk(round=max(hint, 0))


def prev(w: Walk, manifest: Manifest) -> str | None:
    """What the record of :attr:`Walk.round` must name (None: nothing is checked)."""
    return expected_prev(manifest, w.held, w.round)


def found(w: Walk, manifest: Manifest, record: RoundRecord) -> Walk:
    """The round's record, valid and chained as :func:`prev` asked: on to the next round."""
    check, held = taken(w.check, manifest, w.held, record)
    return attrs.evolve(w, round=held.round + 1, held=held, check=check)


def missing(w: Walk) -> Walk:
    """The round holds no usable record: the walk is past the tip, steps back to check it,
    or starts over from the tape's start when the tip has no predecessor."""
    held = w.held
    back = None if held is None else step_back(w.check, held)
    if held is not None and back is not None:
        return attrs.evolve(w, round=held.round - 1, held=None, check=back)
    stray = orphan(w.check, w.round)
    refused = w.refused if stray is None else (*w.refused, stray)
    if held is None and w.round > 0:
        return Walk(round=0, refused=refused)
    return attrs.evolve(w, check=TipCheck(), refused=refused, done=True)
