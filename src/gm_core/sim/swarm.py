"""Swarm testing: many small random scenarios, each reproducible from its seed alone.

Theory of operation
-------------------
A single hand-written scenario exercises the paths its author thought of. A
swarm draws each scenario's *shape* at random too — how many learners and
closers, the protocol config, how flaky the store is, which faults strike whom —
so that, over a thousand seeds, unusual combinations (a throttled store during a
takeover, a poisoned learner that also crashes, a list lag longer than the
grace window) are tried without anyone imagining them. :func:`scenario` is a
pure function of the seed; a failing seed is replayed with
``gm simulate --swarm SEED``. Runs are short (a minute or two of virtual time)
and check every invariant after every action.
"""

from __future__ import annotations

import attrs
import numpy as np

from gm_core.records import AlgorithmConfig, Alignment, MergeRule
from gm_core.sim.scenario import (
    CheckPolicy,
    Fault,
    FaultKind,
    Latency,
    RandomFaults,
    RequestClass,
    Scenario,
    SpeedProfile,
    StoreProfile,
)
from gm_core.sim.speed import closer_names, learner_names


def scenario(seed: int, duration_s: float = 30.0) -> Scenario:
    """The swarm scenario of ``seed``: its shape, store and faults all drawn from it."""
    rng = np.random.default_rng([0x5EED, seed])
    learners = int(rng.integers(2, 5))
    closers = int(rng.integers(1, 3))
    colocate = bool(rng.random() < 0.6)
    config = attrs.evolve(_config(rng, learners), follow=_follow(seed, learners))
    shape = Scenario(learners=learners, closers=closers, colocate=colocate)
    names = learner_names(learners) + tuple(n for n in closer_names(shape) if n.startswith("c"))
    return Scenario(
        name=f"swarm-{seed}",
        seed=seed,
        learners=learners,
        closers=closers,
        colocate=colocate,
        duration_s=duration_s,
        config=config,
        poll_s=float(rng.choice([0.5, 1.0, 2.0])),
        renew_s=float(rng.choice([1.0, 2.0])),
        store=_store(rng),
        speed=SpeedProfile(
            step_s=float(rng.choice([0.25, 0.5, 1.0])),
            jitter=float(rng.choice([0.0, 0.1, 0.3])),
            slow_share=float(rng.choice([0.0, 0.5])),
            slow_factor=float(rng.choice([1.2, 2.0, 5.0])),
        ),
        faults=_faults(rng, names, learner_names(learners), duration_s),
        random_faults=RandomFaults(
            crash_per_h=float(rng.choice([0.0, 20.0, 60.0])),
            down_s=float(rng.choice([2.0, 10.0])),
            cutoff_per_h=float(rng.choice([0.0, 30.0])),
            cutoff_s=float(rng.choice([2.0, 8.0])),
            slow_per_h=float(rng.choice([0.0, 30.0])),
        ),
        check=CheckPolicy.EVERY,
    )


def _config(rng: np.random.Generator, learners: int) -> AlgorithmConfig:
    fragments = int(rng.integers(1, 3))
    return AlgorithmConfig(
        sync_every=int(rng.integers(max(2, fragments), 9)),
        fragments=fragments,
        quorum=int(rng.integers(1, learners + 1)),
        in_flight=int(rng.integers(1, 4)),
        overlap_steps=None if rng.random() < 0.7 else int(rng.integers(0, 4)),
        alignment=Alignment(str(rng.choice([a.value for a in Alignment]))),
        merge=MergeRule(str(rng.choice([m.value for m in MergeRule]))),
        grace_gamma=float(rng.choice([0.0, 0.5, 1.0])),
        lease_timeout_s=float(rng.choice([3.0, 6.0])),
        takeover_floor_s=float(rng.choice([4.0, 8.0])),
    )


def _follow(seed: int, learners: int) -> int:
    """``follow`` for half the seeds (publishing early once that many others have), drawn
    from a stream of its own so that every other draw of a seed stays what it was."""
    rng = np.random.default_rng([0x5EED, seed, 0xF0])
    return 0 if rng.random() < 0.5 else int(rng.integers(1, learners + 1))


def _store(rng: np.random.Generator) -> StoreProfile:
    scale = float(rng.choice([0.2, 1.0, 5.0]))
    return StoreProfile(
        latency={
            cls: Latency(median_s=0.02 * scale, sigma=float(rng.choice([0.2, 0.8])))
            for cls in RequestClass
        },
        fail_rate=float(rng.choice([0.0, 0.01, 0.05])),
        lost_rate=float(rng.choice([0.0, 0.01, 0.05])),
        throttle_rps=None if rng.random() < 0.8 else float(rng.choice([20.0, 60.0])),
        list_lag_s=float(rng.choice([0.0, 0.0, 0.5, 3.0])),
    )


def _faults(
    rng: np.random.Generator, nodes: tuple[str, ...], learners: tuple[str, ...], horizon_s: float
) -> tuple[Fault, ...]:
    """A few explicit faults: late joins, clean leaves, poison, garbage in the bucket."""
    out = []
    for kind, chance, pool in (
        (FaultKind.JOIN, 0.3, learners[1:]),
        (FaultKind.CLOSE, 0.2, learners[1:]),
        (FaultKind.POISON, 0.2, learners),
        (FaultKind.HOSTILE, 0.3, nodes),
        (FaultKind.CRASH, 0.4, nodes),
        (FaultKind.PAUSE, 0.3, learners),
    ):
        if pool and rng.random() < chance:
            node = str(rng.choice(pool))
            at = float(rng.uniform(0.0, horizon_s * 0.8))
            duration = (
                float(rng.uniform(1.0, 15.0)) if kind in (FaultKind.CRASH, FaultKind.PAUSE) else 0.0
            )
            out.append(Fault(kind=kind, node=node, at_s=at, duration_s=duration))
    return tuple(out)
