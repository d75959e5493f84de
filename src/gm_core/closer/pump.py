"""What the closer does after any event: poll for its phase, renew its lease, set one timer.

Every transition ends here (:func:`_pump`): the phase's own step (boot probe, follow,
watch, collect), the lease renewal when it is due, and a single :class:`WakeAt` at the
earliest moment anything could change without an outcome arriving (:func:`_wake`).
"""

from __future__ import annotations

import attrs

from gm_core import election, liveness
from gm_core.closer import boot, collect
from gm_core.closer.state import NEVER, TICK_S, Ask, CloserState, Phase, _watched
from gm_core.commands import Command, WakeAt
from gm_core.requests import Purpose, issue


def _pump(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if state.phase in (Phase.IDLE, Phase.STOPPED):
        return state
    if state.phase is Phase.BOOTING:
        state = boot._boot_probe(state, now_s, cmds)
    elif state.phase is Phase.FOLLOWING:
        state = boot._follow(state, now_s, cmds)
    elif state.phase is Phase.BLOCKED:
        state = boot._watch(state, now_s, cmds)
    elif state.phase is Phase.COLLECTING:
        state = collect._collect(state, now_s, cmds)
    state = _renew(state, now_s, cmds)
    return _wake(state, now_s, cmds)


def _writes_lease(state: CloserState) -> bool:
    return state.options.write_lease or state.serving


def _renew(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if not _writes_lease(state) or now_s < state.lease_at_s:
        return state
    renew_s = _renew_s(state)
    roles = election.ELECTED if state.serving else election.DEDICATED
    state, req = issue(state, Purpose(kind=Ask.OWN_LEASE))
    put, seq = liveness.renewal(state, req, roles, now_s)
    cmds.append(put)
    return attrs.evolve(state, lease_seq=seq, lease_at_s=now_s + renew_s)


def _renew_s(state: CloserState) -> float:
    return liveness.renew_s_of(state)


def _probe_s(state: CloserState) -> float:
    return liveness.probe_interval_s(_renew_s(state))


_POLLED_BY = {
    Phase.BOOTING: Ask.TAPE,
    Phase.FOLLOWING: Ask.WATCH,
    Phase.BLOCKED: Ask.WATCH,
    Phase.COLLECTING: Ask.LIST,
}
"""The request kind each phase's polling issues (at most one in flight)."""


def _wake(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Ask for one timer at the earliest moment anything could change without an outcome.

    A deadline that has passed but whose work cannot start — the poll while its
    request is in flight, lease probes with nobody to probe — is left out: a timer
    for it would fire at once, find nothing to do and ask again, a busy loop until
    the outcome arrives, which pumps the machine anyway.
    """
    times = [state.lease_at_s if _writes_lease(state) else NEVER]
    polled_by = _POLLED_BY.get(state.phase)
    if polled_by is not None and polled_by not in state.busy:
        times.append(state.poll_at_s)
    if state.phase is Phase.FOLLOWING:
        if _watched(state) not in ("", state.node):
            times.append(state.leases_at_s)
        takeover_at = boot._takeover_at(state)
        if takeover_at > now_s:  # once due, the look before the bid is in flight
            times.append(takeover_at)
    if state.phase is Phase.COLLECTING:
        probes_at = state.leases_at_s if collect._unreported(state) else NEVER
        discover_at = state.discover_at_s if Ask.DISCOVER not in state.busy else NEVER
        collect_at = state.collect_at_s if state.swept_below > 0 else NEVER
        times.extend(
            (probes_at, discover_at, collect_at, state.close_at_s, _lease_expiry(state, now_s))
        )
    wake = max(min(times), now_s)
    if wake != state.wake_s:
        if wake < NEVER:
            cmds.append(WakeAt(at_s=wake))
        state = attrs.evolve(state, wake_s=wake)
    return state


def _lease_expiry(state: CloserState, now_s: float) -> float:
    """The next moment a live learner's lease would go stale (quorum may then be met)."""
    timeout_s = state.manifest.config.lease_timeout_s
    expiries = [
        v.changed_at_s + timeout_s + TICK_S
        for v in state.leases.values()
        if v.etag is not None and v.changed_at_s + timeout_s >= now_s
    ]
    return min(expiries, default=NEVER)
