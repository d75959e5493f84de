"""Publishing early: a learner behind the others publishes a round once ``follow`` have.

Theory of operation
-------------------
A round closes once its quorum is in and the grace window has passed (or every live
learner has reported). A learner slower than the others reaches the round's step late:
the round either waits for it or closes without it, and its steps go to a later round.
The reference package's ``follow`` has such a learner publish *at once*, with the steps
it has, as soon as ``follow`` other learners have a snapshot in its round: it keeps the
round's pace instead of its own, and the round closes without waiting for it.

The reference's learners list the round's snapshot folder to count, the requests gm
removed (only the closer lists, spec/protocol.md §14.4). Here the leading closer, which
lists that folder anyway, counts the snapshots it has *accepted* — a garbage or rejected
snapshot counts for nothing — and once they reach :func:`threshold` while a live learner
has not reported, writes one create-once marker, ``follow/{round}.json`` (sealed under the
run's key like every object). A learner with ``follow`` set GETs that one key every poll
while it heads for a round that is not yet due; finding a valid marker for its round, it
asks the shell for its step count at the next step and publishes the round then, its
schedule position moving up to the round's step (as when a commit shows the run has
moved past it: spec/protocol.md §7.5). A marker that does not decode, or names another
round, is ignored: the learner publishes on schedule, as without ``follow``. The cost is
one GET per poll per waiting learner and one PUT per round; none with ``follow = 0``.
Markers are swept with their round's snapshots.
"""

from __future__ import annotations

import json
from typing import Final

from gm_core import codec

FORMAT: Final = 1
BODY_MAX_BYTES: Final = 256
"""A marker is a few dozen bytes; anything larger is refused unread."""


def threshold(follow: int, live: int) -> int | None:
    """Accepted snapshots that make the leader write a round's marker, with ``live``
    learners live (reported or not); None: none is written.

    ``follow`` others, but never more than the other live learners nor fewer than one
    (as the reference caps it); 0 never, and a learner alone has nobody to follow.
    """
    if follow <= 0 or live < 2:
        return None
    return max(1, min(follow, live - 1))


def encode(round_: int, accepted: int) -> bytes:
    """The marker's body: canonical JSON naming its round and the snapshots accepted."""
    doc = {"accepted": accepted, "format": FORMAT, "round": round_}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode(body: bytes, round_: int) -> int | None:
    """The accepted count a marker found at ``round_``'s key names, or None when it is not one.

    Total: no input raises. Refused: over :data:`BODY_MAX_BYTES`, not JSON, fields other than
    exactly accepted/format/round, another format, a round other than the key's, a count
    that is not a positive integer.
    """
    doc = codec.small_object(body, BODY_MAX_BYTES, frozenset({"accepted", "format", "round"}))
    if doc is None:
        return None
    accepted, fmt, found = doc["accepted"], doc["format"], doc["round"]
    if type(fmt) is not int or fmt != FORMAT or type(found) is not int or found != round_:
        return None
    if type(accepted) is not int or accepted < 1:
        return None
    return accepted
