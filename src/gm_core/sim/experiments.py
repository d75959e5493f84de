"""Named experiments built from scenarios: the heterogeneity study.

Theory of operation
-------------------
Decoupled DiLoCo's claim is that a minimum quorum plus an adaptive grace window
keeps fast learners busy without throwing away slow learners' work. The study
runs one fleet — half its learners 18% slower, every step jittered by ±10% —
training the same small model under three closing policies:

* quorum 1 with the grace window (γ = 0.5, the default): close once one
  snapshot is in, then wait for stragglers as long as the fastest learner would
  not be kept waiting;
* quorum 1 without it (γ = 0): close as soon as one snapshot is in;
* quorum M: wait for every learner (synchronous DiLoCo).

Each arm is the same scenario, seed and data with only ``quorum`` and
``grace_gamma`` changed, so the differences are the policies'. Each reports
goodput (of the middle of the run), the committed model's final test loss,
rounds per hour, participants per round and staleness.
"""

from __future__ import annotations

import attrs

from gm_core.records import AlgorithmConfig, Alignment
from gm_core.sim import world
from gm_core.sim.scenario import (
    CheckPolicy,
    Latency,
    RequestClass,
    Scenario,
    SpeedProfile,
    StoreProfile,
    TrainingSpec,
)


@attrs.frozen(kw_only=True)
class Arm:
    name: str
    quorum: int
    grace_gamma: float
    goodput: float
    final_loss: float | None
    rounds_per_h: float
    participants: float
    staleness: float
    rejected: int
    ok: bool


def heterogeneous_fleet(
    learners: int = 8,
    duration_s: float = 900.0,
    seed: int = 0,
    alignment: Alignment = Alignment.OVERWRITE,
) -> Scenario:
    """Half the learners 18% slower, ±10% jitter per step, training an MLP each."""
    return Scenario(
        name="heterogeneity",
        seed=seed,
        learners=learners,
        closers=1,
        colocate=False,
        duration_s=duration_s,
        config=AlgorithmConfig(
            sync_every=20,
            fragments=2,
            quorum=1,
            in_flight=2,
            alignment=alignment,
            lease_timeout_s=20.0,
            takeover_floor_s=30.0,
        ),
        poll_s=0.5,
        renew_s=5.0,
        speed=SpeedProfile(step_s=1.0, jitter=0.10, slow_share=0.5, slow_factor=1.18),
        training=TrainingSpec(),
        check=CheckPolicy.END,
    )


def arms(learners: int) -> tuple[tuple[str, int, float], ...]:
    return (
        ("quorum 1 + grace", 1, 0.5),
        ("quorum 1, no grace", 1, 0.0),
        (f"quorum {learners} (all)", learners, 0.5),
    )


def heterogeneity(
    learners: int = 8,
    duration_s: float = 900.0,
    seed: int = 0,
    alignment: Alignment = Alignment.OVERWRITE,
) -> tuple[Arm, ...]:
    """Run the three arms on the same fleet, data and seed."""
    base = heterogeneous_fleet(learners, duration_s, seed, alignment)
    out = []
    for name, quorum, gamma in arms(learners):
        config = attrs.evolve(base.config, quorum=quorum, grace_gamma=gamma)
        report = world.run(attrs.evolve(base, name=name, config=config))
        s = report.summary
        out.append(
            Arm(
                name=name,
                quorum=quorum,
                grace_gamma=gamma,
                goodput=s.settled_goodput,
                final_loss=s.final_loss,
                rounds_per_h=s.rounds_per_h,
                participants=s.participants_mean,
                staleness=s.staleness_mean,
                rejected=sum(s.rejections.values()),
                ok=report.ok,
            )
        )
    return tuple(out)


def two_speed_fleet(
    *,
    step_s: float = 0.05,
    duration_s: float,
    in_flight: int = 2,
    grace_seconds: float | None = None,
    follow: int = 0,
    latency_s: float = 0.005,
    seed: int = 0,
    training: TrainingSpec | None = None,
) -> Scenario:
    """bench_queue's fleet (issue 13): four ``both`` nodes, ``l00`` and ``l01`` twice as slow,
    ``DiLoCo(sync_every=8, fragments=2, quorum=1)``, every request of median ``latency_s``."""
    return Scenario(
        name="two_speed_fleet",
        seed=seed,
        learners=4,
        closers=4,
        colocate=True,
        duration_s=duration_s,
        config=AlgorithmConfig(
            sync_every=8,
            fragments=2,
            quorum=1,
            in_flight=in_flight,
            lease_timeout_s=4.0,
            grace_seconds=grace_seconds,
            follow=follow,
        ),
        poll_s=0.05,
        renew_s=1.0,
        store=StoreProfile(latency=dict.fromkeys(RequestClass, Latency(median_s=latency_s))),
        speed=SpeedProfile(step_s=step_s, slow_share=0.5, slow_factor=2.0),
        training=training,
        check=CheckPolicy.NONE if training is not None else CheckPolicy.EVERY,
    )
