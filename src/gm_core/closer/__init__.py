"""The closer state machine: elect, collect, judge, merge and commit one round at a time.

Theory of operation
-------------------
Every closer-capable node runs this machine; at any round one of them *leads*
and the others *follow*. The newest record names ``next_closer``, who leads the
next round. A follower watches two things on its own clock: the named closer's
lease (an etag that must keep changing) and the next record key. When the lease
goes stale, or no record appears within the takeover timeout, it bids for the
round with a numbered create-once claim ``claims/r/k``; the winner of claim ``k``
leads, and the other followers start their timeout over against it.

Leadership is an optimisation, not the safety mechanism: the record itself is
written create-once, so whatever the claims say, at most one record exists per
round. A closer whose record write finds the key taken has been *superseded*: it
reads the winner's record and adopts it, exactly like a follower would.

Leading round ``r``: list ``snapshots/r/`` (and only that folder; each list
reads it whole, since learners' keys land in any order and the folder holds at
most one key per learner), fetch each new snapshot record, judge it
(:func:`verdicts.judge_snapshot`), have the shell verify its payload, and count
verdicts. Once :func:`verdicts.ready_to_close` holds, wait the adaptive grace
window (or close at once when every live learner has reported), ask the shell
to merge the accepted deltas, then write the record — the commit point. Timing
EMAs, the frontier and the closer's name travel in the record, so any node can
take over from the newest record alone. Garbage collection and the head hint
are written after the commit, off the critical path. A leader also watches its
round's record key while it collects: a follower that judged it dead may have
closed the round, and that record ends the round for everyone.

Pace and evidence. Listings and looks follow the run's pace (:mod:`gm_core.cadence`)
until the round's first snapshot is in, then every ``poll_s``. A new snapshot
counts as its learner's lease renewal, and a learner that has reported counts as
live for the round, so only the leases of learners still awaited are probed; the
leases folder is listed once per lease timeout to learn of learners that joined
(spec/protocol.md §9.6).

Layout
------
This module holds the entry points (:func:`initial`, :func:`advance`) and the
dispatch of each outcome by the :class:`Ask` that requested it (:func:`_outcome`);
the machine itself is split by concern: :mod:`~gm_core.closer.state` (the values),
:mod:`~gm_core.closer.boot` (tape walk, follow, claims, takeover),
:mod:`~gm_core.closer.collect` (list, fetch, judge, verify, leases),
:mod:`~gm_core.closer.commit` (quorum, grace, merge, record, sweep) and
:mod:`~gm_core.closer.pump` (what to do after any event, renewal, timers). The parts
call each other through their modules (``commit._maybe_close(...)``), looked up at
call time: to replace a function (a planted bug), patch the module that defines it.
"""

from __future__ import annotations

from typing import assert_never

import attrs

from gm_core import auth, keys, tip
from gm_core.auth import RunAuth
from gm_core.closer import boot, collect, commit, pump
from gm_core.closer.collect import IDLE_POLLS, max_stale_versions
from gm_core.closer.commit import COLLECT_EVERY_TIMEOUTS, COLLECT_MAX_ROUNDS
from gm_core.closer.state import (
    NEVER,
    TICK_S,
    Ask,
    CloserOptions,
    CloserState,
    Entry,
    Phase,
    Result,
    Stage,
    _busy,
)
from gm_core.commands import Command, Delete, Get, Notify
from gm_core.events import CloseRequested, Event, Shared, Started, TimerFired
from gm_core.records import Manifest
from gm_core.requests import Purpose, issue, settle
from gm_core.tape import parse_head

__all__ = [
    "COLLECT_EVERY_TIMEOUTS",
    "COLLECT_MAX_ROUNDS",
    "IDLE_POLLS",
    "NEVER",
    "TICK_S",
    "Ask",
    "CloserOptions",
    "CloserState",
    "Entry",
    "Phase",
    "Result",
    "Stage",
    "advance",
    "initial",
    "max_stale_versions",
]


def initial(
    node: str,
    manifest: Manifest,
    schema_digest: str,
    options: CloserOptions | None = None,
    run_auth: RunAuth | None = None,
) -> CloserState:
    """A closer that has not started; feed it :class:`Started` to find the newest record.

    ``run_auth``: the run key's subkeys (None: an open run); it must match the manifest.
    """
    return CloserState(
        node=node,
        manifest=manifest,
        schema_digest=schema_digest,
        options=options or CloserOptions(),
        envelope=auth.for_machine(node, manifest, run_auth),
    )


def advance(state: CloserState, event: Event) -> Result:
    """The closer's transition function: one event in, the new state and commands out."""
    cmds: list[Command] = []
    now_s = event.now_s
    if state.phase is Phase.STOPPED:
        return state, cmds  # a stopped closer stays stopped, whatever arrives late
    if isinstance(event, Started):
        state = _start(state, event, cmds)
    elif isinstance(event, CloseRequested):
        state = _stop(state, cmds)
    elif isinstance(event, TimerFired):
        state = attrs.evolve(state, wake_s=NEVER)
    elif isinstance(event, Shared):
        heard = collect._heard(state, event, cmds)
        if heard is state:
            return state, cmds  # nothing it takes: as if never told (no pump either)
        state = heard
    else:
        state, purpose = settle(state, getattr(event, "req", -1))  # Stepped has no req
        if purpose is None:
            return state, cmds
        state = attrs.evolve(state, busy=state.busy - {purpose.kind})
        state = _outcome(state, purpose, event, cmds)
    state = pump._pump(state, now_s, cmds)
    return state, cmds


def _start(state: CloserState, event: Started, cmds: list[Command]) -> CloserState:
    if state.phase is not Phase.IDLE:
        return state
    state = attrs.evolve(state, phase=Phase.BOOTING, walk=None, lease_at_s=event.now_s)
    if event.head is not None:  # read with the manifest: the walk starts at once
        return attrs.evolve(state, walk=tip.walk(parse_head(state.envelope, event.head.data)))
    state, req = _busy(state, Purpose(kind=Ask.TAPE, name="head"))
    cmds.append(Get(req=req, key=keys.head()))
    return state


def _stop(state: CloserState, cmds: list[Command]) -> CloserState:
    if pump._writes_lease(state) and state.phase is not Phase.IDLE:
        state, req = issue(state, Purpose(kind=Ask.RELEASE))
        cmds.append(Delete(req=req, keys=(keys.lease(state.node),)))
    cmds.append(Notify(kind="closer_stopped", round=state.round))
    return attrs.evolve(state, phase=Phase.STOPPED)


def _outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    match purpose.kind:
        case Ask.TAPE:
            return boot._tape_outcome(state, purpose, event, cmds)
        case Ask.WATCH:
            return boot._watch_outcome(state, purpose, event, cmds)
        case Ask.CLAIM:
            return boot._claim_outcome(state, purpose, event, cmds)
        case Ask.CLAIM_READ:
            return boot._claim_read(state, purpose, event, cmds)
        case Ask.LEASE | Ask.CLOSER_LEASE:
            return boot._lease_outcome(state, purpose, event, cmds)
        case Ask.LIST:
            return collect._list_outcome(state, purpose, event, cmds)
        case Ask.DISCOVER:
            return collect._discover_outcome(state, purpose, event, cmds)
        case Ask.NEWCOMER:
            return collect._newcomer_outcome(state, purpose, event, cmds)
        case Ask.LATE:
            return commit._late_outcome(state, purpose, event, cmds)
        case Ask.SNAPSHOT:
            return collect._snapshot_outcome(state, purpose, event, cmds)
        case Ask.VERIFY:
            return collect._verify_outcome(state, purpose, event, cmds)
        case Ask.MERGE:
            return commit._merge_outcome(state, purpose, event, cmds)
        case Ask.PRIOR:
            return commit._prior_outcome(state, purpose, event, cmds)
        case Ask.COMMIT:
            return commit._commit_outcome(state, purpose, event, cmds)
        case Ask.CHECK:
            return commit._check_outcome(state, purpose, event, cmds)
        case Ask.HEAD | Ask.OWN_LEASE | Ask.SWEEP | Ask.RELEASE | Ask.LEASE_GC | Ask.FOLLOW:
            return state  # best effort: a failure is retried by the next sweep or renewal
        case unknown:
            assert_never(unknown)
