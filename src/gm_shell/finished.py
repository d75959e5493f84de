"""A finished run, seen from a node: refuse to start on one, stop serving once one is.

``finished.json`` is written create-once by the node that finds the run finished
(:mod:`gm_core.finish`); after it nobody trains or commits any more. A node starting on
such a run is refused by name (:class:`RunFinishedError`) instead of training data that
is already counted, and :meth:`gm_shell.Session.serve` (a dedicated closer's main loop)
returns once it appears. The object is judged like every other (opened under the run's
envelope, decoded by :func:`gm_core.completion.judge_summary`); one that is not believed
is logged and treated as absent.
"""

from __future__ import annotations

import logging

from gm_core import keys
from gm_core.auth import Envelope
from gm_core.completion import Summary, judge_summary
from gm_shell.mailbox import Mailbox
from gm_shell.reads import read_json
from gm_shell.run import RunError

LOG = logging.getLogger("gm")

__all__ = ["RunFinishedError", "believed", "describe", "fetch_finished", "read_finished"]


class RunFinishedError(RunError):
    """The run is finished (``finished.json``): no node starts on it any more."""


async def read_finished(mailbox: Mailbox, envelope: Envelope) -> Summary | None:
    """The run's finished summary, or None while it is not finished (or not believed)."""
    return believed(mailbox, envelope, await fetch_finished(mailbox))


async def fetch_finished(mailbox: Mailbox) -> bytes | None:
    """``finished.json``'s bytes, unjudged: a starting node fetches them while it reads the
    manifest (which it needs to judge them), so refusing a finished run costs no round trip."""
    return await read_json(mailbox, keys.finished())


def believed(mailbox: Mailbox, envelope: Envelope, data: bytes | None) -> Summary | None:
    """The summary in ``finished.json``'s bytes if they are the run's own, else None."""
    if data is None:
        return None
    summary = judge_summary(envelope, data)
    if isinstance(summary, str):
        LOG.warning("%s: rejected %s: %s", mailbox.url, keys.finished(), summary)
        return None
    return summary


def describe(summary: Summary) -> str:
    return (
        f"finished at round {summary.round} (found by {summary.by}): {summary.slices} slices, "
        f"{summary.steps} steps, {summary.tokens} counted"
    )
