"""A learner's share of the run's ``global_batch_size``, from the membership the closer saw.

Theory of operation
-------------------
``Session.batch_size`` splits a global batch among the learners, as the reference
package's does; it must agree between learners without their talking to each other, be
exact (the shares sum to the global batch), and move only when membership does. The
closer of each round knows membership best (the learners whose leases it sees renewing,
and those whose snapshots it judged), so it writes that list into the round record
(``RoundRecord.live``), and every learner computes its share from the newest record it
aligned with by the same pure rule: ``global // n`` each, and the first ``global mod n``
learners in byte order of their ids one more. A learner not yet in the list (it joined
after that record) counts itself in. A share is never below 1: with fewer samples than
learners, the shares sum to more than the global batch (a learner cannot train on none).

Records written before the field existed carry no list; their participants stand in.
"""

from __future__ import annotations

from collections.abc import Iterable

from gm_core.records import RoundRecord


def membership(record: RoundRecord) -> tuple[str, ...]:
    """The learners ``record``'s closer saw live, or its participants when it names none."""
    if record.live:
        return record.live
    return tuple(sorted({p.learner for p in record.participants}))


def share(total: int, live: Iterable[str], me: str) -> int:
    """``me``'s share of ``total`` among ``live`` and itself (see the module docstring)."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    members = sorted(set(live) | {me})
    base, extra = divmod(total, len(members))
    return max(1, base + (1 if members.index(me) < extra else 0))
