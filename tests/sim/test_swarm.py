"""Swarm: a thousand small random scenarios, every invariant after every action, no violation.

Each seed fixes the whole scenario (fleet, config, store behaviour, faults), so a
failure names the seed and the command that replays it. The default suite runs
1,000 seeds of 8 virtual seconds; ``make test-long`` runs 10,000 of 30.
"""

from __future__ import annotations

import pytest

from gm_core.sim import swarm, world

CHUNK = 50


def _run_seeds(first: int, count: int, duration_s: float) -> None:
    failures = []
    for seed in range(first, first + count):
        report = world.run(swarm.scenario(seed, duration_s=duration_s))
        if not report.ok:
            v = report.violations[0]
            tail = "\n    ".join(report.trace_tail[-12:])
            failures.append(
                f"seed {seed}: {v.invariant}: {v.message}\n    {tail}\n"
                f"  replay: gm simulate --swarm {seed}"
            )
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("chunk", range(1000 // CHUNK))
def test_swarm_of_a_thousand_seeds_breaks_no_invariant(chunk: int) -> None:
    _run_seeds(chunk * CHUNK, CHUNK, duration_s=8.0)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a chunk takes ~270 s on a free core; the default 600 s cut off
# four of fifty on a machine shared with a CI run (no violation: the same chunks then passed)
@pytest.mark.parametrize("chunk", range(10_000 // (4 * CHUNK)))
def test_long_swarm_breaks_no_invariant(chunk: int) -> None:
    _run_seeds(100_000 + chunk * 4 * CHUNK, 4 * CHUNK, duration_s=30.0)


@pytest.mark.parametrize("seed", [100285, 101760, 102383, 102501, 109223])
def test_long_swarm_seeds_that_failed_once(seed: int) -> None:
    """100285: a learner closed while booting raised in ``advance``; 101760: a restarted
    learner re-published a round after it was committed and swept (a late write); 102383,
    102501: a closer that fell behind merged a round already committed and swept (the merge
    invariant looked for the snapshots in the store as it is now); 109223: such a closer's
    record write, which found the key taken and created nothing, was judged as if created
    (its record pointed at payloads the sweep had removed)."""
    _run_seeds(seed, 1, duration_s=30.0)


def test_swarm_scenarios_differ_and_are_pure_functions_of_the_seed() -> None:
    assert swarm.scenario(5) == swarm.scenario(5)
    shapes = {(s.learners, s.closers, s.colocate, s.config) for s in map(swarm.scenario, range(40))}
    assert len(shapes) > 30
