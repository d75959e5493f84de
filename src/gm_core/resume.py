"""When a node saves its resume state: a decision about rounds, so it lives here.

Theory of operation
-------------------
The bucket keeps the shared model at every commit, but not what each node's own
training needs to go on where it was: its inner optimizer, learning-rate schedule,
data position and step count. A node that opts in saves those at
``keys.resume(node)`` and, restarted with the same id, restores them after joining
from the newest commit.

It saves at commit boundaries, right after folding in a commit (between two
optimizer steps, where its state is whole), and not at every one: the state is
typically twice the model (Adam's moments), while a round ships one fragment's
delta. So a save is due once the node has folded in commits of at least
``every`` rounds since the round of its previous save; by default ``every`` is
the run's fragment count ``P``, one save per sync cycle (``H`` steps), which
bounds the steps a restart repeats to about ``H`` plus the commits in flight.
A node also saves when it joins (so a crash before the first due save still
finds a state, and a state the node cannot store fails at once) and when it
closes.
"""

from __future__ import annotations


def every_rounds(configured: int | None, fragments: int) -> int:
    """Rounds between two saves: ``configured``, or one sync cycle (``fragments``) if None."""
    every = fragments if configured is None else configured
    if every < 1:
        raise ValueError(f"a resume state is saved every {every} rounds: must be at least 1")
    return every


def due(aligned_round: int, saved_round: int, every: int) -> bool:
    """Whether a node that has folded in the commits up to ``aligned_round``, and saved last
    at ``saved_round`` (-1: before any commit), saves its resume state now."""
    return aligned_round >= saved_round + every
