"""A node's local progress across a restart: taken at a resume save, laid back on restart.

Theory of operation
-------------------
A learner's parameters hold, beyond the commits it folded in, the steps it
trained since: its *local progress*. A resume save (:mod:`gm_shell.resume`) keeps
it per fragment, measured from a base (:func:`gm_core.resume.drifts` says which),
so that a node restarted with the same id goes on from where its parameters were,
not only its optimizer and data.

Taking it (:func:`take`, on the training thread at a boundary save). The core must
have heard of every step and fold-in the model holds before it says where each
fragment's progress starts, so the step is reported first (a round trip to the
loop, as :meth:`Session.pause` makes); the training thread then changes nothing
until the copies are made.

Laying it back (:func:`lay_back`, on the training thread right after the join,
before the first step). Which fragments get it back is the core's decision
(:func:`gm_core.resume.keep`), from what the bucket says the earlier process
published after the save: this node's snapshots still waiting in the rounds
after the newest record (at most ``in_flight``; their rounds are awaited, up to
the join timeout, so that they are judged first and the progress they hold is
folded in before the saved progress is laid over it), then the records since the
save. The kept
fragments' anchors in the core count the saved steps (:func:`gm_core.resume.resumed`)
and their parameters get the progress added, in that order, with no fold-in in
between (nothing runs on the training thread meanwhile).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from gm_core import keys, schedule
from gm_core import resume as core_resume
from gm_core.records import Manifest, RoundRecord
from gm_shell import events
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.pacer import Pacer, StalledError
from gm_shell.replica import Replica
from gm_shell.resume import Progress
from gm_shell.runtime import Runtime
from gm_shell.tapereads import read_record


def take(runtime: Runtime, pacer: Pacer, replica: Replica) -> tuple[int, Progress]:
    """The round folded in and each fragment's local progress, as of this step."""
    runtime.report(pacer.step, pacer.tokens)
    state = runtime.learner
    assert state is not None
    drifts = core_resume.drifts(state, replica.copies())
    progress = tuple((d, replica.progress(f, d.base_round)) for f, d in enumerate(drifts))
    return state.aligned_round, progress


def lay_back(
    *,
    node: str,
    manifest: Manifest,
    runtime: Runtime,
    pacer: Pacer,
    replica: Replica,
    mailbox: Mailbox,
    loop: LoopThread,
    saved_round: int,
    progress: Progress,
    wait_s: float,
    why: Callable[[], str],
) -> tuple[bool, ...]:
    """Restore the fragments' saved progress that the core keeps; which ones it kept.

    ``wait_s``: how long to wait for the rounds holding this node's earlier snapshots to
    be committed and folded in (the session's join timeout)."""
    cfg = manifest.config
    state = runtime.learner
    assert state is not None
    joined, envelope = state.aligned_round, state.envelope

    async def our_snapshots() -> dict[int, int]:
        rounds = range(joined + 1, joined + cfg.in_flight + 1)
        return {
            r: schedule.fragment_of(r, cfg.fragments)
            for r in rounds
            if await mailbox.get(keys.snapshot(r, node)) is not None
        }

    async def records_since() -> dict[int, RoundRecord]:
        found: dict[int, RoundRecord] = {}
        while len(found) <= core_resume.MAX_RECORDS:
            round_ = saved_round + 1 + len(found)
            read = await read_record(mailbox, envelope, cfg, round_)
            if not isinstance(read.record, RoundRecord):
                break
            found[round_] = read.record
        return found

    waiting = loop.run(our_snapshots())
    if waiting:  # let them be judged and folded in first: then their records decide
        last = max(waiting)
        # Still open after that: they count as waiting (the fragments they may change lose it).
        with contextlib.suppress(StalledError):
            pacer.serve(
                lambda: runtime.learner is not None and runtime.learner.aligned_round >= last,
                wait_s,
                why,
            )
    records = loop.run(records_since())
    runtime.report(pacer.step, pacer.tokens)  # the core has heard of every fold-in above
    state = runtime.learner
    assert state is not None
    drifts = [d for d, _ in progress]
    kept = core_resume.keep(
        drifts,
        alignment=cfg.alignment,
        saved_round=saved_round,
        node=node,
        records=records,
        waiting={r: f for r, f in waiting.items() if r not in records},
        versions=[a.version for a in state.anchors],
    )
    if any(kept):
        runtime.amend_learner(lambda s: core_resume.resumed(s, drifts, kept))
        for fragment, (_, array) in enumerate(progress):
            if kept[fragment]:
                replica.add(fragment, array)
    steps = [d.steps for d, back in zip(drifts, kept, strict=True) if back]
    events.LOG.info(
        "%s: local progress of %d of %d fragments restored (%s steps; saved at round %d, "
        "records read %s, own snapshots found after the newest %s)",
        node,
        len(steps),
        len(kept),
        ", ".join(map(str, steps)) or "no",
        saved_round,
        sorted(records),
        sorted(waiting),
    )
    return kept
