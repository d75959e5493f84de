"""Where the model checker's time goes, per bound set: the share of one exploration spent in
each of its parts, measured in one process.

Each part is timed by wrapping its function for the duration of the run (the wrappers add
about a microsecond per call, so the shares of the most frequent parts are a little high):

* ``fingerprint``: :meth:`gm_core.check.fingerprint.Fingerprinter.state`;
* ``steps``: :meth:`gm_core.check.steps.Steps.take`, remembered steps applied and real
  steps on a miss (machine transitions, payload work), the fair runs' included;
* ``actions``: :func:`gm_core.check.actions.enabled`;
* ``judge``: every invariant of every new state (``_Search._judge``);
* ``fair runs``: fair runs run out past the search's bounds (liveness sets only; their
  steps are counted under ``steps`` too).

Shares are ratios within one run, so load distorts them less than it does absolute times;
the rest is the search itself (sleep sets, dominance, tables).

    PYTHONPATH=src .venv/bin/python bench/bench_check_profile.py ["set name" ...]

Set names are those of ``gm check --ci`` (:data:`gm_core.check.bounds.CI_BOUNDS`) and
``--long`` (``LONG_BOUNDS``, ``DEEP_BOUNDS``); by default three CI sets: one exhaustive set
without liveness, one with two closers and a fault, one with liveness.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from gm_core.check import actions, explore, fingerprint, progress, steps
from gm_core.check.bounds import CI_BOUNDS, DEEP_BOUNDS, LONG_BOUNDS

DEFAULT = (
    "three nodes, two fragments",
    "two closers race, one fault",
    "the closer crashes and restarts across two rounds",
)


@contextmanager
def timed(owner: Any, name: str, label: str, spent: dict[str, float]) -> Iterator[None]:
    """``owner.name`` wrapped to add its wall time to ``spent[label]``, then restored."""
    real: Callable[..., Any] = getattr(owner, name)
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return real(*args, **kwargs)
        finally:
            spent[label] += clock() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def profile(name: str) -> tuple[explore.Outcome, float, float, dict[str, float]]:
    """Explore one set: its outcome, wall and CPU seconds, and seconds per part."""
    bounds = {**CI_BOUNDS, **LONG_BOUNDS, **DEEP_BOUNDS}[name]
    spent: dict[str, float] = defaultdict(float)
    with ExitStack() as stack:
        stack.enter_context(timed(fingerprint.Fingerprinter, "state", "fingerprint", spent))
        stack.enter_context(timed(steps.Steps, "take", "steps", spent))
        stack.enter_context(timed(explore, "enabled", "actions", spent))
        stack.enter_context(timed(explore._Search, "_judge", "judge", spent))
        stack.enter_context(timed(progress.FairRuns, "next_commit_s", "fair runs", spent))
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = explore.explore(bounds)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return outcome, wall, cpu, spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sets", nargs="*", help="bound sets (default: three CI sets)")
    args = p.parse_args()
    known = {**CI_BOUNDS, **LONG_BOUNDS, **DEEP_BOUNDS}
    if unknown := [n for n in args.sets if n not in known]:
        p.error(f"unknown bound sets: {unknown}")
    assert actions.enabled is explore.enabled  # the search calls it through explore's name
    for name in args.sets or DEFAULT:
        outcome, wall, cpu, spent = profile(name)
        shares = "  ".join(f"{part} {s / wall:4.0%}" for part, s in spent.items())
        print(
            f"{name}: {outcome.verdict}, {outcome.states:,} states, {wall:.1f} s wall,"
            f" {outcome.states / cpu:,.0f} states/cpu-s\n    {shares}",
            flush=True,
        )


if __name__ == "__main__":
    main()
