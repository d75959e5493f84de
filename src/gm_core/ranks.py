"""Ranks: ``N`` fixed slices of a run's data, each trained by at most one live node at a time.

Theory of operation
-------------------
A rank is a unit of a shared queue (:mod:`gm_core.queue`) that the run keeps under the
reserved name :data:`QUEUE`: ``queue/ranks/units.json`` pins ``N`` (the count and digest
of the rank ids, so a node passing another ``N`` is refused by name before it claims),
and ``queue/ranks/units/{rank:04d}/claims/{attempt}.json`` are numbered create-once
claims. Everything the queue decides holds for ranks unchanged: a node resumes a rank
its id already holds, else takes a rank held by nobody, else one whose holder's lease has
not changed for ``lease_timeout_s`` on its own clock, by writing the next attempt; the
create-once write decides every race, and no time written by another machine is read.

Two things differ from a queue of units, both set by :func:`spec`:

- **The lowest rank first** (``ordered``), and no prefetch: a node holds one rank.
- **The newest claim wins, and the loser learns it while it trains.** The holder sends
  :class:`gm_core.queue.Watch` every renewal interval; an attempt above its own (or its
  own claim gone) answers :attr:`gm_core.queue.Outcome.LOST`, and the node stops with
  ``RankLost``. Two nodes can therefore train one rank at once only between a successor's
  claim — made after the old holder's lease looked dead for a whole timeout — and the old
  holder's next watch, once it runs again. The reference package does the opposite (the
  earlier claimant takes the rank back from the node that took it over).

A rank is done when its holder writes ``done/{attempt}`` at the end of its slice; the
run's completion counts each rank's lowest valid attempt (:mod:`gm_core.completion`'s
``Ranked``), and a rank nobody ever claimed keeps the run open.
"""

from __future__ import annotations

from gm_core import queue
from gm_core.auth import Envelope

QUEUE = "ranks"
"""The queue name ranks live under (a :class:`gm_shell.SharedQueue` may not take it)."""
RANKS_LIMIT = 1000
"""Most ranks a run may have."""
_WIDTH = 4


def unit(rank: int) -> str:
    """The unit id of ``rank`` (zero-padded, so id order is rank order)."""
    if not 0 <= rank < RANKS_LIMIT:
        raise ValueError(f"rank {rank} is outside 0..{RANKS_LIMIT - 1}")
    return f"{rank:0{_WIDTH}d}"


def rank_of(unit_id: str) -> int | None:
    """The rank a unit id of the ranks queue stands for (None: not one)."""
    if len(unit_id) != _WIDTH or not (unit_id.isascii() and unit_id.isdigit()):
        return None
    return int(unit_id)


def spec(
    *, node: str, ranks: int, lease_timeout_s: float, poll_s: float, envelope: Envelope
) -> queue.QueueSpec:
    """The queue machine's spec for a node of a run of ``ranks`` ranks."""
    if not 1 <= ranks <= RANKS_LIMIT:
        raise ValueError(f"ranks must be between 1 and {RANKS_LIMIT}, got {ranks}")
    return queue.QueueSpec(
        queue=QUEUE,
        node=node,
        units=tuple(unit(r) for r in range(ranks)),
        prefetch=0,
        lease_timeout_s=lease_timeout_s,
        poll_s=poll_s,
        envelope=envelope,
        ordered=True,
    )
