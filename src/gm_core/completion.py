"""When a run is finished: every slice of its data counted done once, and no learner live.

Theory of operation
-------------------
A run's data comes in one of three shapes (spec/coordination.md §5):

- **plain** — each node trains its own iterable; gm never sees the data, so the
  most it can know is that some node ran out (``done/{node}.json``);
- **ranked** — ``N`` fixed slices; each must be done, including a slice that no
  node ever claimed (the reference package finishes without those);
- **queued** — a shared queue of units; each must be done.

A rank or unit may carry several done markers, one per claim attempt: a paused
holder and its successor can both finish it, and a garbage object at one attempt's
key must not block the slice for ever. The **counted** completion is the valid
marker of the lowest attempt, a rule every reader applies alike, so each slice's
steps and tokens enter the run's total exactly once.

The run is **finished** when, on the observer's own clock, no learner is live and
every slice has a counted completion (plain: at least one node is done).
:func:`finished` decides it from what a closer has listed and judged; it is pure
and total, and bad markers arrive here already judged (``None``), by
:func:`decode_done`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from gm_core import keys
from gm_core.auth import Envelope, Unauthenticated

DONE_FORMAT = 1
"""The ``format`` of every done marker; any other is refused."""
DONE_MAX_BYTES = 4096
"""A done marker is a handful of bounded fields; anything longer is refused unread."""
COUNT_LIMIT = 2**63
"""Steps and tokens are below this (they travel as JSON integers, read as 64-bit)."""
MISSING_SHOWN = 8
"""How many missing slices a verdict names (the first, in order)."""


@attrs.frozen(kw_only=True)
class DoneMarker:
    """A done marker as judged: who finished the slice, under which attempt, with what."""

    node: str
    attempt: int
    steps: int
    tokens: int


@attrs.frozen
class Plain:
    """Each node trains its own data; the run knows only who ran out."""


@attrs.frozen
class Ranked:
    """``ranks`` fixed slices, numbered from 0 (at least one)."""

    ranks: int = attrs.field(validator=attrs.validators.ge(1))


@attrs.frozen
class Queued:
    """A shared queue of these unit ids (at least one)."""

    units: frozenset[str] = attrs.field(validator=attrs.validators.min_len(1))


Shape = Plain | Ranked | Queued
Slice = str | int
"""A node id (plain), a rank (ranked) or a unit id (queued)."""
Markers = Mapping[Slice, Mapping[int, DoneMarker | None]]
"""Done markers listed, by slice and attempt; None is one refused by :func:`decode_done`."""


@attrs.frozen(kw_only=True)
class Finished:
    """Every slice counted once (sorted by slice); the totals are over those only."""

    counted: tuple[tuple[Slice, DoneMarker], ...]
    steps: int
    tokens: int


@attrs.frozen(kw_only=True)
class NotFinished:
    """What keeps the run open: slices with no counted completion (the first few, and how
    many in all) and the learners still live."""

    missing: tuple[Slice, ...]
    missing_count: int
    live: tuple[str, ...]


Verdict = Finished | NotFinished


def counted(attempts: Mapping[int, DoneMarker | None]) -> DoneMarker | None:
    """The completion that counts for one slice: the valid marker of the lowest attempt."""
    valid = [a for a, marker in attempts.items() if marker is not None]
    return attempts[min(valid)] if valid else None


def finished(shape: Shape, markers: Markers, live: frozenset[str]) -> Verdict:
    """Whether the run is finished, from the judged done markers and the live learners.

    Markers of slices the shape does not have (a rank past ``N``, an unknown unit,
    a node marker in a ranked run) are ignored: they cannot finish anything.
    """
    slices = _slices(shape, markers)
    done = {s: m for s in slices if (m := counted(markers.get(s, {}))) is not None}
    missing = [s for s in slices if s not in done]
    if isinstance(shape, Plain):
        missing = [] if done else missing  # plain: any one node done will do
    if missing or live or not done:
        return NotFinished(
            missing=tuple(missing[:MISSING_SHOWN]),
            missing_count=len(missing),
            live=tuple(sorted(live)),
        )
    items = tuple(sorted(done.items(), key=lambda item: _order(item[0])))
    return Finished(
        counted=items,
        steps=sum(m.steps for _, m in items),
        tokens=sum(m.tokens for _, m in items),
    )


def _slices(shape: Shape, markers: Markers) -> list[Slice]:
    if isinstance(shape, Ranked):
        return list(range(shape.ranks))
    if isinstance(shape, Queued):
        return sorted(shape.units)
    return sorted(s for s in markers if isinstance(s, str))


def _order(s: Slice) -> tuple[int, int, str]:
    return (0, s, "") if isinstance(s, int) else (1, 0, s)


def encode_done(marker: DoneMarker) -> bytes:
    body = {"format": DONE_FORMAT, **attrs.asdict(marker)}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_done(data: bytes, attempt: int) -> DoneMarker | str:
    """The done marker in ``data``, found at ``attempt``'s key; a string says why it is
    refused. Total: no input raises."""
    if len(data) > DONE_MAX_BYTES:
        return f"{len(data)} bytes, over {DONE_MAX_BYTES}"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as error:
        return f"not JSON: {type(error).__name__}"
    if not isinstance(doc, dict) or set(doc) != {"format", "node", "attempt", "steps", "tokens"}:
        return "not an object with exactly format, node, attempt, steps and tokens"
    numbers = [doc["format"], doc["attempt"], doc["steps"], doc["tokens"]]
    if not all(type(n) is int and 0 <= n < COUNT_LIMIT for n in numbers):
        return "format, attempt, steps and tokens must be non-negative 64-bit integers"
    if doc["format"] != DONE_FORMAT:
        return f"format {doc['format']} is not {DONE_FORMAT}"
    if doc["attempt"] != attempt:
        return f"attempt {doc['attempt']} is not the key's {attempt}"
    if not isinstance(doc["node"], str) or not keys.valid_id(doc["node"]):
        return f"node {doc['node']!r:.80} is not an id"
    return DoneMarker(node=doc["node"], attempt=attempt, steps=doc["steps"], tokens=doc["tokens"])


# --- the finished summary ------------------------------------------------------------------

FINISHED_FORMAT = 1


@attrs.frozen(kw_only=True)
class Summary:
    """What ``finished.json`` says: who found the run finished, at which committed round,
    and what was trained (slices counted, and their steps and tokens, each once)."""

    by: str
    round: int
    slices: int
    steps: int
    tokens: int


def encode_summary(summary: Summary) -> bytes:
    body = {"format": FINISHED_FORMAT, **attrs.asdict(summary)}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_summary(data: bytes) -> Summary | str:
    """The summary in ``data``; a string says why it is refused. Total: no input raises."""
    if len(data) > DONE_MAX_BYTES:
        return f"{len(data)} bytes, over {DONE_MAX_BYTES}"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as error:
        return f"not JSON: {type(error).__name__}"
    fields = {"format", "by", "round", "slices", "steps", "tokens"}
    if not isinstance(doc, dict) or set(doc) != fields:
        return f"not an object with exactly {', '.join(sorted(fields))}"
    numbers = [doc["format"], doc["slices"], doc["steps"], doc["tokens"]]
    if not all(type(n) is int and 0 <= n < COUNT_LIMIT for n in numbers):
        return "format, slices, steps and tokens must be non-negative 64-bit integers"
    if type(doc["round"]) is not int or not -1 <= doc["round"] < keys.ROUND_LIMIT:
        return f"round {doc['round']!r:.40} is not a round (or -1)"
    if doc["format"] != FINISHED_FORMAT:
        return f"format {doc['format']} is not {FINISHED_FORMAT}"
    if not isinstance(doc["by"], str) or not keys.valid_id(doc["by"]):
        return f"by {doc['by']!r:.80} is not an id"
    del doc["format"]
    return Summary(**doc)


def judge_summary(envelope: Envelope, data: bytes) -> Summary | str:
    """The summary found at ``finished.json``, opened under the run's envelope and decoded;
    a string says why it is not believed. Total: no input raises."""
    body = envelope.open(keys.finished(), data)
    if isinstance(body, Unauthenticated):
        return body.detail
    return decode_summary(body)
