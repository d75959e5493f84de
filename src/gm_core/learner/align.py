"""Aligning commits: fold each record into the model in tape order, and move the anchors.

An aligned commit moves its fragment's anchor (where the next delta is measured from);
an unusable one is passed over with the model kept; a failed fetch, or a commit that
rejected this learner's delta as non-finite, sends the learner back to joining
(:func:`_rejoin`). Under ``adaptive`` alignment each commit also moves its fragment's mode.
"""

from __future__ import annotations

import attrs

from gm_core import adaptive, retention, tip
from gm_core.commands import Align, Command, Notify
from gm_core.events import Aligned, Event, Unusable
from gm_core.learner import boot, publish
from gm_core.learner.state import Anchor, Ask, LearnerState, Phase
from gm_core.records import Alignment, Reason, RoundRecord
from gm_core.requests import Purpose, failure, issue


def _aligned(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    if isinstance(event, Unusable):
        return _unusable(state, purpose, event, cmds)
    if not isinstance(event, Aligned):
        # The payload could not be fetched (swept while we lagged, or a store failure):
        # join again from the newest record, which re-reads its frontier.
        cmds.append(Notify(kind="align_failed", round=purpose.round, detail=failure(event)))
        return _rejoin(state)
    if purpose.kind is Ask.LOAD:
        loading = state.loading - {purpose.round}
        if state.phase is not Phase.LOADING:
            return attrs.evolve(state, loading=loading)  # closed meanwhile: it stays so
        phase = Phase.RUNNING if not loading else state.phase
        if not loading:
            cmds.append(Notify(kind="joined", round=state.aligned_round))
            state = attrs.evolve(state, lost=None)
        return attrs.evolve(state, loading=loading, phase=phase)
    return _apply_alignment(state, purpose.round, event, cmds)


def _unusable(
    state: LearnerState, purpose: Purpose[Ask], event: Unusable, cmds: list[Command]
) -> LearnerState:
    """A commit's payload is unusable (spec/protocol.md §16.10): use the commit before it."""
    if purpose.kind is Ask.LOAD:
        return boot._load_earlier(state, purpose.round, event, cmds)
    record = state.fetched.get(purpose.round)
    if record is None:
        return state
    if event.reason is Reason.MISSING and _superseded(state, record):
        # Swept while we lagged, and a newer commit of the fragment is in hand: align that
        # one instead, as when it was in hand before this one's fetch (§7.6).
        return _aligned_through(state, record.round, cmds, applied=False)
    window = retention.KEEP_CYCLES * state.manifest.config.fragments
    if event.reason is Reason.MISSING and record.round + window <= state.seen_round:
        # Swept while we lagged: the run has newer commits; join again from the newest.
        cmds.append(Notify(kind="align_failed", round=record.round, detail=failure(event)))
        return _rejoin(state)
    # The model keeps the commit before this one, which is what a closer merges the
    # next round of the fragment into (§16.10). The anchor takes the commit's version,
    # so the next snapshot is not stale, and keeps its step: the delta still counts
    # every step since the commit the model holds.
    detail = (
        f"fragment {record.fragment} version {record.version}: {failure(event)}; "
        "this learner keeps the commit it holds"
    )
    cmds.append(Notify(kind="commit_unusable", round=record.round, detail=detail))
    anchors = list(state.anchors)
    anchors[record.fragment] = attrs.evolve(anchors[record.fragment], version=record.version)
    state = attrs.evolve(state, anchors=tuple(anchors))
    return _aligned_through(state, record.round, cmds, applied=False)


def _superseded(state: LearnerState, record: RoundRecord) -> bool:
    """Whether a fetched record commits ``record``'s fragment again, and ``record`` can be
    passed over for it: it did not merge this learner's snapshot (carry would then move
    the anchor to that snapshot's step), and we are not closing (a closing learner waits
    to see its own rounds).

    Aligning every commit in tape order, one per step, a learner whose steps are slower
    than the run's commits falls behind without bound, and the closer sweeps the
    payloads it would fetch next (two cycles are kept, §12.3): it found them absent and
    re-joined, and fell behind again (a re-join loop). Overwrite and carry give the
    same model from the newer commit alone (the commit is replaced; carry keeps the
    local steps since the anchor either way), so the older one is not fetched.
    """
    return (
        state.phase is Phase.RUNNING
        and not _included(state, record)
        and any(
            r.fragment == record.fragment and r.round > record.round for r in state.fetched.values()
        )
    )


def _rejoin(state: LearnerState) -> LearnerState:
    """Load the whole model again from the newest record, as a joining learner does.

    Not while closing: a closing learner waits only to see its last rounds committed, and
    the shell leaves the model at the newest commit itself; going back to joining would
    end running, with the close forgotten (bench_queue saw ``close()`` stall so). It stops
    waiting instead: what is still out is judged by the closer without it.
    """
    if state.phase in (Phase.CLOSING, Phase.CLOSED):
        return attrs.evolve(
            state,
            aligning=None,
            fetched={},
            outgoing={},
            retries={},
            flushes=frozenset(),
            loading=frozenset(),
            pending={r: p for r, p in state.pending.items() if p.kind not in (Ask.LOAD, Ask.ALIGN)},
        )
    return attrs.evolve(
        state,
        phase=Phase.BOOTING,
        loading=frozenset(),
        priors={},
        fallen={},
        aligning=None,
        fetched={},
        walk=tip.walk(state.seen_round),
        pending={r: p for r, p in state.pending.items() if p.kind not in (Ask.LOAD, Ask.ALIGN)},
    )


def _diverged(state: LearnerState, record: RoundRecord, cmds: list[Command]) -> LearnerState:
    """A commit rejected this learner's delta as non-finite: its model holds NaN or Inf.

    Aligning one fragment would keep the poison in the others (and in the shell's
    inner optimizer), so the learner loads every fragment from the newest commit,
    as on joining, and says so by name (``diverged``, with how many times in a
    row); the shell resets what the user registered (the inner optimizer) and
    raises once divergence repeats.
    """
    times = state.divergences + 1
    detail = f"non-finite delta rejected; reloading every fragment; times={times}"
    cmds.append(Notify(kind="diverged", round=record.round, detail=detail))
    # Snapshots already taken still go out (the closer awaits them) and may be poisoned
    # too: their rejections are this same divergence, not a new one.
    return _rejoin(attrs.evolve(state, divergences=times, reloaded_from=state.next_round))


def _poisoned(state: LearnerState, record: RoundRecord) -> bool:
    """Whether ``record`` rejects as non-finite a snapshot taken since the last reload."""
    return record.round >= state.reloaded_from and any(
        x.learner == state.node and x.reason is Reason.NONFINITE for x in record.rejections
    )


def _apply_alignment(
    state: LearnerState, round_: int, event: Aligned, cmds: list[Command]
) -> LearnerState:
    """Commit ``round_`` is now in the model: move the fragment's anchor."""
    record = state.fetched[round_]
    anchors = list(state.anchors)
    anchors[record.fragment] = _new_anchor(state, record, event.step, event.tokens)
    return _aligned_through(attrs.evolve(state, anchors=tuple(anchors)), round_, cmds)


def _aligned_through(
    state: LearnerState, round_: int, cmds: list[Command], *, applied: bool = True
) -> LearnerState:
    """Every record up to ``round_`` is now reflected in the model (``applied``), or
    passed over with the model kept as it was (an unusable commit)."""
    fetched = dict(state.fetched)
    record = fetched.pop(round_)
    outgoing = {r: o for r, o in state.outgoing.items() if r > round_}
    if applied:
        cmds.append(Notify(kind="aligned", round=round_, detail=f"version={record.version}"))
    behind = _behind(state, record)
    out = state.outgoing.get(round_)
    if behind and out is not None and out.published:
        state = attrs.evolve(state, requests_lost=state.requests_lost + out.requests)
    state = attrs.evolve(
        state,
        fetched=fetched,
        outgoing=outgoing,
        aligned_round=round_,
        aligning=None,
        behind=behind,
    )
    if state.phase is Phase.CLOSING:
        state = publish._reflush(state, record)
    return state


def _behind(state: LearnerState, record: RoundRecord) -> bool:
    """Whether we are not yet in phase with the run: true from joining until a record
    names a snapshot of ours, and again whenever a record closes without one we
    published (it landed after the round closed).

    Such a learner probes every poll: seeing a record before its own snapshot for
    that round is what lets it skip ahead (:func:`_catch_up`) and get in phase;
    a learner whose snapshots count follows the run's pace instead.
    """
    out = state.outgoing.get(record.round)
    if out is None or not out.published:
        return state.behind
    named = {p.learner for p in record.participants} | {x.learner for x in record.rejections}
    return state.node not in named


def _included(state: LearnerState, record: RoundRecord) -> bool:
    """Whether ``record`` merged this learner's snapshot of its round."""
    out = state.outgoing.get(record.round)
    if out is None or not out.published:
        return False
    return state.node in {p.learner for p in record.participants}


def _new_anchor(state: LearnerState, record: RoundRecord, step: int, tokens: int) -> Anchor:
    """Where the fragment's step and token counts restart after aligning ``record``.

    Carry keeps local progress, so each trained step is contributed exactly once:
    the steps up to this learner's snapshot are in the commit only if the record
    merged that snapshot; if it did not (it landed after the round closed, or was
    rejected), the anchor keeps its counts and the next snapshot of the fragment
    reports them again, with the parameters' delta to match (``Align.from_snapshot``).
    """
    old = state.anchors[record.fragment]
    if _mode(state, record.fragment) is Alignment.CARRY:
        out = state.outgoing.get(record.round)
        if out is not None and _included(state, record):
            return Anchor(version=record.version, step=out.step, tokens=out.tokens)
        return attrs.evolve(old, version=record.version)
    return Anchor(version=record.version, step=step, tokens=tokens)


def _align_next(state: LearnerState, cmds: list[Command]) -> LearnerState:
    """Align the next record in tape order; a record that changed nothing needs no fetch."""
    while state.aligning is None:
        round_ = state.aligned_round + 1
        record = state.fetched.get(round_)
        if record is None:
            return state
        if _poisoned(state, record):
            return _diverged(state, record, cmds)
        if _included(state, record):
            state = attrs.evolve(state, divergences=0)
        state = _adapt(state, record, cmds)
        if _superseded(state, record):
            # A newer commit of the fragment is in hand: fold in that one alone.
            state = _aligned_through(state, round_, cmds, applied=False)
            continue
        if record.version == state.anchors[record.fragment].version:
            # Nothing was committed: the parameters and the anchor's counters stay, so
            # the steps still in the fragment's delta keep counting toward its weight.
            state = _aligned_through(state, round_, cmds)
            continue
        mode = _mode(state, record.fragment)
        state, req = issue(state, Purpose(kind=Ask.ALIGN, round=round_))
        cmds.append(
            Align(
                req=req,
                round=round_,
                fragment=record.fragment,
                version=record.version,
                theta=record.theta,
                mode=mode,
                mixing=state.manifest.config.mixing if mode is Alignment.BLEND else 1.0,
                from_snapshot=_included(state, record),
            )
        )
        state = attrs.evolve(state, aligning=round_)
    return state


def _mode(state: LearnerState, fragment: int) -> Alignment:
    """How the next commit of ``fragment`` is folded in: the run's rule, or under
    ``adaptive`` the fragment's current mode."""
    rule = state.manifest.config.alignment
    if rule is not Alignment.ADAPTIVE:
        return rule
    return state.modes[fragment] if state.modes else adaptive.INITIAL


def _adapt(state: LearnerState, record: RoundRecord, cmds: list[Command]) -> LearnerState:
    """Under ``adaptive`` alignment, move ``record``'s fragment's mode by its cosine."""
    cfg = state.manifest.config
    if cfg.alignment is not Alignment.ADAPTIVE or record.cosine is None:
        return state
    was = _mode(state, record.fragment)
    mode = adaptive.next_mode(was, record.cosine, cfg.carry_above, cfg.overwrite_below)
    if mode is was:
        return state
    modes = list(state.modes or (adaptive.INITIAL,) * cfg.fragments)
    modes[record.fragment] = mode
    detail = f"fragment={record.fragment} {mode.value} cosine {record.cosine:.3f}"
    cmds.append(Notify(kind="alignment_changed", round=record.round, detail=detail))
    return attrs.evolve(state, modes=tuple(modes))
