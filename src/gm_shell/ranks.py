"""``Session(ranks=N)``: this node trains one of ``N`` fixed slices, and stops once it lost it.

Theory of operation
-------------------
::

    with Session(model, algorithm=..., mailbox=url, ranks=4) as s:
        s.run(train_one_batch, slice_of(s.rank))     # RankLost if a peer took the rank over

Which rank a node holds, and when it has lost it, is :mod:`gm_core.ranks`' (a shared queue
of rank units): entering the session claims the lowest rank held by nobody, or by a node
whose lease has stopped changing on this node's clock, waiting while every rank is held by
a live node. While the node trains, a watcher on the session's loop re-lists its rank's
claims every renewal interval; a newer claim makes :meth:`gm_shell.Session.step` and
:meth:`gm_shell.Session.close` raise :class:`RankLost` (the node was judged dead, say
paused past the lease timeout, and a peer restarted the slice: the peer keeps it).
"""

from __future__ import annotations

from gm_core import ranks
from gm_core.auth import Envelope
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.queue import Consumer, QueueMismatchError

__all__ = ["RankHolder", "RankLost", "RanksDoneError"]


class RankLost(RuntimeError):  # noqa: N818 (the reference package's name, kept for users)
    """A peer claimed this node's rank (this node looked dead to it): the peer trains it now."""

    def __init__(self, node: str, rank: int, attempt: int) -> None:
        self.node = node
        self.rank = rank
        self.attempt = attempt
        super().__init__(
            f"{node} lost rank {rank}: a peer claimed it over this node's claim {attempt} "
            "(this node's lease had stopped changing on its clock for the lease timeout)"
        )


class RanksDoneError(RuntimeError):
    """Every rank of the run is done: there is no slice left for this node."""


class RankHolder:
    """The rank a node holds: claimed on creation, watched while it trains, marked done."""

    def __init__(
        self,
        mailbox: Mailbox,
        loop: LoopThread,
        *,
        node: str,
        ranks_count: int,
        lease_timeout_s: float,
        poll_s: float,
        watch_s: float,
        envelope: Envelope,
    ) -> None:
        spec = ranks.spec(
            node=node,
            ranks=ranks_count,
            lease_timeout_s=lease_timeout_s,
            poll_s=poll_s,
            envelope=envelope,
        )
        try:
            self._consumer = Consumer(mailbox, loop, spec)
        except QueueMismatchError as error:
            raise QueueMismatchError(f"ranks={ranks_count}: {error}") from None
        assignment = self._consumer.want()
        if assignment is None:
            raise RanksDoneError(f"{node}: every one of the run's {ranks_count} ranks is done")
        rank = ranks.rank_of(assignment.unit)
        assert rank is not None
        self.node = node
        self.rank = rank
        self.attempt = assignment.attempt
        self.lost: RankLost | None = None
        """Set (on the loop) once a watch found the rank taken over."""
        self._consumer.watch(watch_s, self._lose)

    def _lose(self) -> None:
        self.lost = RankLost(self.node, self.rank, self.attempt)

    def finish(self, steps: int, tokens: int) -> None:
        """Write the rank's done marker; raise :class:`RankLost` if a peer holds it now."""
        self.stop()
        if self.lost is not None:
            raise self.lost
        if not self._consumer.finish(ranks.unit(self.rank), steps, tokens):
            self._lose()
            assert self.lost is not None
            raise self.lost

    def stop(self) -> None:
        """Stop watching and let deletions already sent land (bounded)."""
        self._consumer.unwatch()
        self._consumer.close()
