"""What the cluster tests of tests/core share: short timers, one random move of a run, and a
fair schedule."""

from __future__ import annotations

import random
from collections.abc import Sequence

from gm_core import closer, learner
from gm_core import cluster as cl

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
FAST_L = learner.LearnerOptions(poll_s=0.5, renew_s=1.0, close_timeout_s=5.0)
"""Sub-second polls and a 5 s close timeout, so a run commits within a few hundred moves."""
FAST_C = closer.CloserOptions(poll_s=0.5, renew_s=1.0)


def random_step(c: cl.Cluster, rng: random.Random, names: Sequence[str]) -> cl.Cluster:
    """One random move of the run: deliver a request, fire timers, train, let time pass."""
    move = rng.random()
    if c.inflight and move < 0.6:
        return cl.deliver(c, rng.randrange(len(c.inflight)))
    if move < 0.7:
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        return c
    if move < 0.9:
        name = rng.choice(sorted(names))
        return cl.train(c, name, 1) if cl.can_train(c, name) else c
    return cl.tick(c, rng.choice([0.25, 1.0, 5.0]))


def drive(
    c: cl.Cluster, ticks: int, rng: random.Random, hung: frozenset[str] = frozenset()
) -> cl.Cluster:
    """A fair schedule that delivers commands in a random order; ``hung`` nodes get nothing."""
    for _ in range(ticks):
        while True:
            ready = [i for i, f in enumerate(c.inflight) if f.node not in hung]
            if not ready:
                break
            c = cl.deliver(c, rng.choice(ready))
        for name, machine in cl.due_timers(c):
            if name not in hung:
                c = cl.fire(c, name, machine)
        for name in rng.sample(sorted(c.nodes), len(c.nodes)):
            if name not in hung:
                c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
        assert not cl.check(c), cl.check(c)
    return c


def paced(
    c: cl.Cluster, ticks: int, rng: random.Random, fast: Sequence[str], slow: str, every: int
) -> cl.Cluster:
    """A fair schedule in which the ``fast`` learners train a step every tick and ``slow``
    one every ``every`` ticks (requests delivered in a random order)."""
    for tick in range(ticks):
        while c.inflight:
            c = cl.deliver(c, rng.randrange(len(c.inflight)))
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in fast if tick % every else (*fast, slow):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
    return c
