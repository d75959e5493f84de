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
missed, with the reason, rather than left out: that is the measurement.

The replaced attributes are looked up at call time (module globals), so the
real machines run with exactly one rule changed. Plants are for the checker's
own tests; nothing else imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import attrs

from gm_core import auth, closer, liveness, timing, verdicts
from gm_core.check.bounds import CI_BOUNDS
from gm_core.check.explore import Bounds
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
    bounds: Bounds
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
            bounds=CI_BOUNDS["one node two rounds in flight"],
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
    )
}
"""The planted bugs, by name, each a different rule."""
