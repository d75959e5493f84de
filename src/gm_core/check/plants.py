"""Planted protocol bugs: how strong is the checker's verdict?

Theory of operation
-------------------
Pinned state counts detect change, not truth. To measure what the checker's
*verdict* catches, each :class:`Plant` breaks one rule of the protocol with a
one-line change to one function of the machines (or of a rule they call),
installed by replacing that module attribute for the duration of a ``with``
block (:func:`planted`), and names the bound set in which a correct protocol
passes and the broken one should not. ``gm check --plant NAME`` runs it;
``tests/check`` asserts the verdict of each against :attr:`Plant.caught`, the
table spec/protocol.md §15.9 reports. A plant the checker misses is listed as
missed, with the reason, rather than left out: that is the measurement. The shared
queue's, the ranks' and the barrier's plants name a coordination set
(:class:`~gm_core.check.queue.QueueBounds`, :class:`~gm_core.check.barrier.BarrierBounds`),
explored by that search (:func:`explore`), and are judged the same way.

The replaced attributes are looked up at call time (module globals), so the
real machines run with exactly one rule changed. Plants are for the checker's
own tests; nothing else imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import attrs

from gm_core import auth, barrier, closer, completion, liveness, queue, schedule, timing, verdicts
from gm_core.check import barrier as barrier_check
from gm_core.check import explore as cluster_check
from gm_core.check import queue as queue_check
from gm_core.check.barrier import BarrierBounds
from gm_core.check.bounds import CI_BOUNDS, COORDINATION_BOUNDS
from gm_core.check.explore import Bounds
from gm_core.check.queue import QueueBounds
from gm_core.closer import boot, collect
from gm_core.commands import Command, PutOnce
from gm_core.records import Reason, Timing


@attrs.frozen(kw_only=True)
class Plant:
    """One broken rule: where, the change in words, and where the checker should see it."""

    name: str
    rule: str
    change: str
    module: ModuleType
    attribute: str
    broken: Callable[[Any], Any]
    """Given the real attribute, the broken one."""
    bounds: Bounds | QueueBounds | BarrierBounds
    caught: bool
    """Whether the checker's verdict catches it at ``bounds`` (the measured table)."""
    why_missed: str = ""
    slow: bool = False
    """Too slow for ``make test`` (checked by ``make check-long`` and ``-m slow``)."""


@contextmanager
def planted(plant: Plant) -> Iterator[None]:
    """Run the body with ``plant``'s rule broken; the real attribute is restored after."""
    real = getattr(plant.module, plant.attribute)
    setattr(plant.module, plant.attribute, plant.broken(real))
    try:
        yield
    finally:
        setattr(plant.module, plant.attribute, real)


def caught(plant: Plant) -> tuple[bool, tuple[str, ...]]:
    """Explore ``plant``'s bounds with its rule broken: whether the verdict is not a pass, and
    what it says (the violated invariants, or the verdict's name)."""
    with planted(plant):
        return explore(plant.bounds)


def explore(bounds: Bounds | QueueBounds | BarrierBounds) -> tuple[bool, tuple[str, ...]]:
    """Explore a bound set with its own search: whether the verdict is not a pass, and what
    it says."""
    if isinstance(bounds, Bounds):
        outcome = cluster_check.explore(bounds)
        return outcome.verdict != "pass", (outcome.verdict,)
    found = (
        queue_check.explore(bounds)
        if isinstance(bounds, QueueBounds)
        else barrier_check.explore(bounds)
    )
    return bool(found.violation), found.violation


def _quorum_off_by_one(real: Callable[..., bool]) -> Callable[..., bool]:
    def ready_to_close(*, accepted: int, **rest: Any) -> bool:
        return real(accepted=accepted + 1, **rest)

    return ready_to_close


def _takeover_without_claim(real: Callable[..., closer.CloserState]) -> Callable[..., Any]:
    def follow(state: closer.CloserState, now_s: float, cmds: list[Command]) -> Any:
        before = len(cmds)
        state = real(state, now_s, cmds)
        if state.phase is not closer.Phase.CLAIMING:
            return state
        for cmd in [c for c in cmds[before:] if isinstance(c, PutOnce)]:
            cmds.remove(cmd)
        return boot._open(state, now_s, 0, cmds)

    return follow


def _accept_zero_steps(real: Callable[..., Reason | None]) -> Callable[..., Reason | None]:
    def judge(state: closer.CloserState, snapshot: Any) -> Reason | None:
        reason = real(state, snapshot)
        return None if reason is Reason.ZERO_STEPS else reason

    return judge


def _lease_never_times_out(real: Callable[..., bool]) -> Callable[..., bool]:
    def is_live(view: liveness.LeaseView | None, now_s: float, timeout_s: float) -> bool:
        return real(view, now_s, math.inf)

    return is_live


def _grace_without_estimates(real: Callable[..., float]) -> Callable[..., float]:
    def grace_s(t: Timing, *, ahead_steps: int, gap_steps: int, gamma: float) -> float:
        return real(t, ahead_steps=ahead_steps, gap_steps=gap_steps, gamma=gamma) + 0.25

    return grace_s


def _trust_any_tag(real: Callable[..., Any]) -> Callable[..., Any]:
    def verify(run_auth: Any, run_id: str, key: str, data: bytes) -> bytes:
        return data.split(b"\n", 1)[1] if data.startswith(auth.MARKER) else data

    return verify


def _trust_any_signer(real: Callable[..., Any]) -> Callable[..., Any]:
    def signed(signing: Any, run_id: str, key: str, data: bytes, body: bytes) -> bytes:
        return body

    return signed


def _linear_merge_weight(real: Callable[[int, int], float]) -> Callable[[int, int], float]:
    def merge_weight(tokens: int, steps: int) -> float:
        return real(tokens, steps) / max(tokens, 1)

    return merge_weight


def _never_superseded(real: Callable[..., bool]) -> Callable[..., bool]:
    def superseded(attempt: int, claims: Iterable[int]) -> bool:
        return False

    return superseded


def _no_resume(real: Callable[..., tuple[tuple[str, int], ...]]) -> Callable[..., Any]:
    def choose(units: Iterable[str], **named: Any) -> tuple[tuple[str, int], ...]:
        picks = real(units, **named)
        return tuple(p for p in picks if named["holders"].get(p[0]) != named["me"])

    return choose


def _keep_unstarted(real: Callable[..., Any]) -> Callable[..., Any]:
    def give_next(state: queue.QueueState) -> Any:
        return queue._reply(state, queue.Outcome.GIVEN)

    return give_next


def _claimed_ranks_only(real: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    def slices(shape: completion.Shape, markers: Any) -> list[Any]:
        found = real(shape, markers)
        if isinstance(shape, completion.Ranked):
            return [s for s in found if s in markers]
        return found

    return slices


def _finish_with_live_learners(real: Callable[..., Any]) -> Callable[..., Any]:
    def finished(shape: completion.Shape, markers: Any, live: frozenset[str]) -> Any:
        return real(shape, markers, frozenset())

    return finished


def _forget_the_next_unit(real: Callable[..., Any]) -> Callable[..., Any]:
    def unassign(state: queue.QueueState, unit: str) -> queue.QueueState:
        return attrs.evolve(state, current=None)

    return unassign


def _release_one_early(real: Callable[[int, int], bool]) -> Callable[[int, int], bool]:
    def is_full(arrived: int, parties: int) -> bool:
        return real(arrived + 1, parties)

    return is_full


def _name_every_arrival(real: Callable[..., tuple[str, ...]]) -> Callable[..., tuple[str, ...]]:
    def members(state: barrier.BarrierState) -> tuple[str, ...]:
        return tuple(sorted({*state.arrived, state.spec.party}))

    return members


def _ignore_revocations(
    real: Callable[[auth.Signing, str, str], str | None],
) -> Callable[[auth.Signing, str, str], str | None]:
    def revoked(signing: auth.Signing, signer: str, key: str) -> str | None:
        return None

    return revoked


def _one_fragment_after_a_cycle(real: Callable[[int, int], int]) -> Callable[[int, int], int]:
    def fragment_of(round: int, fragments: int) -> int:
        return real(round, fragments) if round < fragments else 0

    return fragment_of


PLANTS: dict[str, Plant] = {
    p.name: p
    for p in (
        Plant(
            name="quorum-off-by-one",
            rule="closing (§10.1)",
            change="ready_to_close counts one more accepted snapshot than there is",
            module=verdicts,
            attribute="ready_to_close",
            broken=_quorum_off_by_one,
            # The closer learns of n1's lease from a probe at t=1: only then is closing
            # with one snapshot wrong.
            bounds=Bounds(roles=("lc", "l"), quorum=2, rounds=1, max_time_s=1.0),
            caught=True,
            slow=True,
        ),
        Plant(
            name="takeover-without-claim",
            rule="election (§9.2)",
            change="a follower that decides to take over opens the round without bidding",
            module=boot,
            attribute="_follow",
            broken=_takeover_without_claim,
            bounds=CI_BOUNDS["two closers race for round 0"],
            caught=True,
        ),
        Plant(
            name="accept-zero-steps",
            rule="acceptance (§11.1)",
            change="the closer's judge lets a zero-step snapshot through",
            module=collect,
            attribute="_judge",
            broken=_accept_zero_steps,
            # Not 'one node two rounds in flight' any more: a node alone now lists the
            # leases before closing a round on its learner's snapshot heard of, and that
            # set stops at two records (no fair run) before a zero-step snapshot is judged.
            # Here the fair run after a lost request reaches one (2,330 states).
            bounds=CI_BOUNDS["one node, one fault"],
            caught=True,
        ),
        Plant(
            name="lease-never-times-out",
            rule="liveness (§9.4)",
            change="is_live ignores the lease timeout",
            module=liveness,
            attribute="is_live",
            broken=_lease_never_times_out,
            bounds=CI_BOUNDS["a learner dies for good, quorum 2"],
            caught=True,
        ),
        Plant(
            name="grace-without-estimates",
            rule="grace window (§10.2)",
            change="grace_s adds a quarter second, estimates or not",
            module=timing,
            attribute="grace_s",
            broken=_grace_without_estimates,
            bounds=CI_BOUNDS["two learners, one closes"],
            caught=True,
        ),
        Plant(
            name="linear-merge-weight",
            rule="merge weights (§11.2)",
            change="merge_weight returns tokens/steps instead of tokens²/steps",
            module=verdicts,
            attribute="merge_weight",
            broken=_linear_merge_weight,
            bounds=CI_BOUNDS["two learners, one closes"],
            caught=True,
        ),
        Plant(
            name="skip-tag-verification",
            rule="authentication (§16.2)",
            change="verify takes any object, tagged or not, as the run's own",
            module=auth,
            attribute="verify",
            broken=_trust_any_tag,
            bounds=CI_BOUNDS["a forger without the key, two rounds"],
            caught=True,
        ),
        Plant(
            name="skip-signature-check",
            rule="per-node keys (§16.3)",
            change="an object with a valid run-key tag opens whoever signed it, for any key",
            module=auth,
            attribute="_signed",
            broken=_trust_any_signer,
            bounds=CI_BOUNDS["a member forges a commit (per-node keys)"],
            caught=True,
        ),
        Plant(
            name="skip-revocation-check",
            rule="revocation (§16.3.3)",
            change="a revoked member's word counts at every round",
            module=auth,
            attribute="_revoked",
            broken=_ignore_revocations,
            bounds=CI_BOUNDS["a revoked member publishes its own snapshot (per-node keys)"],
            caught=True,
        ),
        Plant(
            name="queue-holder-never-superseded",
            rule="queue: losing a unit (coordination §2.2)",
            change="superseded is always False: a holder judged dead keeps its unit",
            module=queue,
            attribute="superseded",
            broken=_never_superseded,
            bounds=COORDINATION_BOUNDS["queue: two nodes race for one unit"],
            caught=True,
        ),
        Plant(
            name="queue-no-resume",
            rule="queue: resumable (coordination §2.2)",
            change="choose never offers a node its own claimed units",
            module=queue,
            attribute="choose",
            broken=_no_resume,
            bounds=COORDINATION_BOUNDS["queue: one node, two units, a crash and restart"],
            caught=True,
        ),
        Plant(
            name="either-keeps-unstarted-claims",
            rule="either: giving back (coordination §6.3)",
            change="an elected node's give-back ends at once, its prefetched claim kept",
            module=queue,
            attribute="_give_next",
            broken=_keep_unstarted,
            bounds=COORDINATION_BOUNDS["queue: an either node elected after a unit, prefetch 1"],
            caught=True,
        ),
        Plant(
            name="finish-on-claimed-ranks",
            rule="run completion (coordination §5.2)",
            change="a rank without a done marker does not hold the run open (the reference's rule)",
            module=completion,
            attribute="_slices",
            broken=_claimed_ranks_only,
            bounds=COORDINATION_BOUNDS[
                "ranks: one node, two ranks, it looks when its rank is done"
            ],
            caught=True,
        ),
        Plant(
            name="finish-with-live-learners",
            rule="run completion (coordination §5.2)",
            change="the finish look ignores learners whose leases are live",
            module=completion,
            attribute="finished",
            broken=_finish_with_live_learners,
            bounds=COORDINATION_BOUNDS["queue: two nodes, one unit, the first to run out looks"],
            caught=True,
        ),
        Plant(
            name="queue-finish-forgets-the-next-unit",
            rule="queue: claiming ahead (coordination §2.2)",
            change="writing an ended unit's done marker clears the unit being trained (the "
            "consumer before it claimed ahead)",
            module=queue,
            attribute="_unassign",
            broken=_forget_the_next_unit,
            bounds=COORDINATION_BOUNDS["queue: one node, three units, pipelined, a crash"],
            caught=True,
        ),
        Plant(
            name="barrier-releases-one-early",
            rule="barrier: release (coordination §4.2)",
            change="is_full counts one more arrival than there is",
            module=barrier,
            attribute="is_full",
            broken=_release_one_early,
            bounds=COORDINATION_BOUNDS["barrier: two parties"],
            caught=True,
        ),
        Plant(
            name="barrier-names-every-arrival",
            rule="barrier: release (coordination §4.2)",
            change="a marker names every arrival, not exactly parties",
            module=barrier,
            attribute="_members",
            broken=_name_every_arrival,
            bounds=COORDINATION_BOUNDS["barrier: one party, two waiters overflow"],
            caught=True,
        ),
        # Every node agrees with the broken rule, so only an invariant that re-states the
        # schedule sees it, and only from round P + 1 on: the four-round set, no other.
        Plant(
            name="one-fragment-after-a-cycle",
            rule="schedule (§4)",
            change="fragment_of gives fragment 0 to every round after the first cycle",
            module=schedule,
            attribute="fragment_of",
            broken=_one_fragment_after_a_cycle,
            bounds=CI_BOUNDS[
                "three nodes, two fragments, four rounds, the closer crashes (1 delay)"
            ],
            caught=True,
        ),
    )
}
"""The planted bugs, by name, each a different rule."""
