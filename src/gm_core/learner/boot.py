"""Joining: read the head hint, walk the tape to its tip, load every fragment from it.

Also the path taken when a record arrives while running (:func:`_record_outcome`),
since booting and following read the same keys, and the fallback when a fragment's
newest commit is unusable on joining (load the commit before it, §16.10, or say the
fragment is lost and try again later).
"""

from __future__ import annotations

import attrs

from gm_core import cadence, fallback, schedule, tip
from gm_core.commands import Align, Command, Fetch, Get, Notify
from gm_core.events import Event, GotObject, Shared, Unusable
from gm_core.learner import align
from gm_core.learner.state import Anchor, Ask, LearnerState, Phase, schedule_step
from gm_core.records import Alignment, FragmentState, RoundRecord
from gm_core.requests import Purpose, failure, issue
from gm_core.tape import (
    BadRecord,
    SlotCursor,
    exhausted,
    expected_prev,
    frontier_of,
    parse_head,
    parse_record,
    record_key,
    rejected,
    skip,
    slot_of,
)


def _record_outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    """A head hint or a round record arrived (or did not): move the tape forward."""
    now_s, poll_s = event.now_s, state.options.poll_s
    booting = state.phase is Phase.BOOTING
    if purpose.kind is Ask.RECORD and not booting and purpose.round <= state.seen_round:
        # Heard of meanwhile from this node's closer (:func:`_heard`): nothing new here.
        return attrs.evolve(state, probing=False)
    poll_later = attrs.evolve(state, probing=False, probe_at_s=now_s + poll_s)
    if not isinstance(event, GotObject):
        return poll_later
    if purpose.kind is Ask.HEAD:
        hint = parse_head(state.envelope, event.data)
        return attrs.evolve(state, probing=False, probe_at_s=now_s, walk=tip.walk(hint))
    if event.data is None:
        if booting:
            return _walked(state, tip.missing(state.walk), now_s, cmds)
        records = cadence.missed(state.records)
        idle_until_s = cadence.next_look_s(
            records, now_s, poll_s, longest_s=state.manifest.config.lease_timeout_s
        )
        return attrs.evolve(poll_later, records=records, idle_until_s=idle_until_s)
    parsed = _parsed(state, purpose.round, int(purpose.name), event.data)
    if isinstance(parsed, BadRecord):
        return _bad_record(state, parsed, now_s, cmds)
    if booting:  # only the tip matters: keep memory bounded while searching for it
        records = cadence.restart(state.records, now_s)
        state = attrs.evolve(state, records=records, idle_until_s=now_s)
        return _walked(state, tip.found(state.walk, state.manifest, parsed), now_s, cmds)
    return _adopt(attrs.evolve(state, probing=False), parsed, now_s)


def _parsed(state: LearnerState, round_: int, slot: int, data: bytes) -> RoundRecord | BadRecord:
    """The object at ``slot`` of round ``round_``'s record key, judged as the tape's next."""
    prev = expected_prev(state.manifest, state.held, round_)
    return parse_record(state.envelope, data, round_, state.manifest.config, slot, prev)


def _adopt(state: LearnerState, record: RoundRecord, now_s: float) -> LearnerState:
    """``record`` is the tape's next: fetched for alignment, and the next round probed."""
    fetched = dict(state.fetched)
    fetched[record.round] = record
    live = state.phase in (Phase.RUNNING, Phase.CLOSING)
    records = (cadence.seen if live else cadence.restart)(state.records, now_s)
    state = attrs.evolve(
        state,
        fetched=fetched,
        held=record,
        seen_round=record.round,
        probe_at_s=now_s,
        records=records,
        idle_until_s=now_s,
    )
    if live:
        state = _catch_up(state, record)
    return state


def _heard(state: LearnerState, event: Shared) -> LearnerState:
    """This node's closer created ``event.key``: if it is the next record at the slot a
    probe would read, adopt it as the probe would, without waiting for one.

    Only a record that opens as the tape's next is taken: anything else (another key, a
    slot the probe would not read, a record that does not chain) is left to the probe,
    which reads the same bytes and reports what it finds. A probe already out for the
    round comes back to a round seen, and is dropped (:func:`_record_outcome`).
    """
    if state.phase not in (Phase.RUNNING, Phase.CLOSING):
        return state
    round_ = state.seen_round + 1
    slot = slot_of(state.record_slots, round_)
    if event.key != record_key(state.envelope, round_, slot):
        return state
    parsed = _parsed(state, round_, slot, event.data)
    if isinstance(parsed, BadRecord):
        return state
    return _adopt(state, parsed, event.now_s)


def _bad_record(
    state: LearnerState, bad: BadRecord, now_s: float, cmds: list[Command]
) -> LearnerState:
    """An invalid object at a slot of the next record's key: read the slot above it now.

    A newer format's record, or one side of a fork, stops the probe (skipping it would
    split the tape between readers); a key whose every slot is invalid is reported once
    and read again from slot 0 every lease timeout (only an operator can clear it).
    """
    if bad.round != state.exhausted_round:  # a key already reported exhausted: quietly
        detail = f"slot {bad.slot}: {bad.reason}"
        cmds.append(Notify(kind=rejected(bad), round=bad.round, detail=detail))
    poll_later = attrs.evolve(state, probing=False, probe_at_s=now_s + state.options.poll_s)
    if bad.stops:
        return poll_later
    cursor = skip(state.record_slots, bad)
    if exhausted(cursor, bad.round):
        if bad.round != state.exhausted_round:
            cmds.append(Notify(kind="slots_exhausted", round=bad.round, detail=bad.reason))
        # Only an operator can clear the key: read its slots again once a lease timeout.
        again_s = now_s + state.manifest.config.lease_timeout_s
        return attrs.evolve(
            state,
            probing=False,
            probe_at_s=again_s,
            record_slots=SlotCursor(),
            exhausted_round=bad.round,
        )
    return attrs.evolve(state, probing=False, probe_at_s=now_s, record_slots=cursor)


def _walked(state: LearnerState, walk: tip.Walk, now_s: float, cmds: list[Command]) -> LearnerState:
    """Booting, the search for the tip moved on: probe its next round, or load the tip.

    The record of the round the head hint names is likely the tip (the head is seldom
    more than a round behind): once the walk holds it, its commits are fetched
    (:class:`Fetch`), so that the loads after the walk's last reads find them read;
    nothing reaches the model before the walk adopts a tip. Records met while galloping
    from a lagging or garbage hint are not fetched (their commits are mostly old)."""
    hinted = walk.held is not None and walk.held.round == walk.hint
    newly = hinted and walk.held is not state.walk.held
    state = attrs.evolve(state, walk=walk, held=walk.held, probing=False, probe_at_s=now_s)
    if not walk.done:
        if newly:
            frontier = frontier_of(state.manifest, walk.held)
            cmds.extend(Fetch(fragment=f, theta=fs.theta) for f, fs in enumerate(frontier))
        return state
    for round_, why in walk.refused:
        cmds.append(Notify(kind="record_rejected", round=round_, detail=why))
    newest = walk.held
    seen = -1 if newest is None else newest.round
    fetched = {} if newest is None else {seen: newest}
    # The finished walk is forgotten: nodes that joined alike are in the same state.
    state = attrs.evolve(state, seen_round=seen, fetched=fetched, walk=tip.walk(-1))
    return _begin_loading(state, cmds)


def _catch_up(state: LearnerState, record: RoundRecord) -> LearnerState:
    """The run committed ``record``: never head for a round that is already closed."""
    if record.round < state.next_round:
        return state
    lag = schedule_step(state, record.round) - state.step
    return attrs.evolve(state, next_round=record.round + 1, offset=state.offset + max(lag, 0))


def _begin_loading(state: LearnerState, cmds: list[Command]) -> LearnerState:
    """The newest record is known: overwrite every fragment from its frontier."""
    newest = state.fetched.get(state.seen_round)
    frontier = frontier_of(state.manifest, newest)
    cfg = state.manifest.config
    loading = set()
    for fragment, fs in enumerate(frontier):
        state = _load(state, fragment, fs, state.seen_round, cmds)
        loading.add(fragment)
    position = schedule.step_of(state.seen_round, cfg.sync_every, cfg.fragments) if newest else 0
    return attrs.evolve(
        state,
        phase=Phase.LOADING,
        probing=False,
        loading=frozenset(loading),
        fetched={},
        aligned_round=state.seen_round,
        next_round=max(state.next_round, state.seen_round + 1),
        offset=max(state.offset, position - state.step),
        anchors=tuple(
            Anchor(version=fs.version, step=state.step, tokens=state.tokens) for fs in frontier
        ),
    )


def _load(
    state: LearnerState, fragment: int, fs: FragmentState, round_: int, cmds: list[Command]
) -> LearnerState:
    """Overwrite ``fragment`` with the commit ``fs`` (named by record ``round_``)."""
    state, req = issue(state, Purpose(kind=Ask.LOAD, round=fragment))
    cmds.append(
        Align(
            req=req,
            round=round_,
            fragment=fragment,
            version=fs.version,
            theta=fs.theta,
            mode=Alignment.OVERWRITE,
            mixing=1.0,
            from_snapshot=False,
        )
    )
    return state


def _load_earlier(
    state: LearnerState, fragment: int, event: Unusable, cmds: list[Command]
) -> LearnerState:
    """Joining, ``fragment``'s commit is unusable: load the one before it, or give up."""
    if fragment in state.fallen:
        why = f"the commit before it is unusable too ({event.key})"
        message = fallback.lost(fragment, state.fallen[fragment], why)
        return _lost(state, message, event.now_s, cmds)
    version = state.anchors[fragment].version
    if state.lost is None:
        detail = (
            f"fragment {fragment} version {version}: {failure(event)}; joining from the one before"
        )
        cmds.append(Notify(kind="commit_unusable", round=state.aligned_round, detail=detail))
    found = fallback.prior(state.manifest, fragment, version, event.key)
    return _found_prior(state, fragment, event.key, found, event.now_s, cmds)


def _found_prior(
    state: LearnerState,
    fragment: int,
    key: str,
    found: fallback.Prior | FragmentState | str,
    now_s: float,
    cmds: list[Command],
) -> LearnerState:
    """Load the earlier commit, read the next slot of its record, or give up."""
    priors = {f: p for f, p in state.priors.items() if f != fragment}
    if isinstance(found, str):
        return _lost(state, fallback.lost(fragment, key, found), now_s, cmds)
    if isinstance(found, FragmentState):
        # The anchor keeps the unusable commit's version, as for a commit skipped while
        # running (:func:`_unusable`): a closer merges into this same earlier commit.
        state = attrs.evolve(state, priors=priors, fallen={**state.fallen, fragment: key})
        return _load(state, fragment, found, state.aligned_round, cmds)
    state, req = issue(state, Purpose(kind=Ask.PRIOR, round=fragment))
    cmds.append(Get(req=req, key=record_key(state.envelope, found.round, found.slot)))
    return attrs.evolve(state, priors={**priors, fragment: found})


def _prior_outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    at = state.priors.get(purpose.round)
    if at is None or state.phase is not Phase.LOADING:
        return state
    if not isinstance(event, GotObject):
        cmds.append(Notify(kind="align_failed", round=at.round, detail=failure(event)))
        return align._rejoin(state)
    found = fallback.read_prior(state.envelope, state.manifest.config, at, event.data)
    return _found_prior(state, at.fragment, at.key, found, event.now_s, cmds)


def _lost(state: LearnerState, message: str, now_s: float, cmds: list[Command]) -> LearnerState:
    """No usable commit of a fragment to join from: say so once, try again in a while.

    The learner joins again from the newest record after a lease timeout: a later
    commit of the fragment, or an operator's restore, lets it in.
    """
    if message != state.lost:
        cmds.append(Notify(kind="commit_lost", round=state.aligned_round, detail=message))
    again_s = now_s + state.manifest.config.lease_timeout_s
    return attrs.evolve(align._rejoin(state), lost=message, probe_at_s=again_s)
