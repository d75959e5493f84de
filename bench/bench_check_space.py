"""Where the model checker's states come from: what coarser time, symmetry and partial-order
reduction could each remove, measured on the bound sets before building any of them.

Each figure is a count of states, so it does not depend on the machine's load:

* ``clock``: how many distinct clock values the reachable states have, and how many
  states remain when the clock is left out of each state (an upper bound on what any
  abstraction of time that keeps the rest of the state could merge);
* ``symmetry``: the number of permutations of interchangeable node names (equal
  roles, not the run's creator ``n0``, all crashable or none): a symmetry reduction
  keeps at least one state per orbit, so it divides the count by at most that;
* three partial-order experiments, each taking, where it applies, one node's enabled
  actions alone (the others' later): ``local`` when that node has only timers and
  training enabled, ``stable`` also reads of keys that exist, ``reads`` every read
  (GET, probe, LIST). These are *not* sound reductions — the conditions leave out
  the clock move (every delivery is stamped with the time it lands, so it depends on
  it) and, for ``reads``, another node's write to what is read — so their counts are
  upper bounds on what a sound persistent-set reduction with those conditions keeps
  out, not reductions the checker may use. The verdicts printed with them are not
  the checker's.

    PYTHONPATH=src .venv/bin/python bench/bench_check_space.py ["set name" ...]

The experiments replace :func:`gm_core.check.explore.enabled` (and, to see every
state, ``_Search._judge``) for the duration of one exploration, as the planted bugs
replace a rule (gm_core.check.plants).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from gm_core import cluster
from gm_core.check import explore as ex
from gm_core.check.actions import Action, Kind, index_of
from gm_core.check.bounds import CI_BOUNDS, LONG_BOUNDS
from gm_core.check.fingerprint import Fingerprinter
from gm_core.commands import Get, List, Probe

SETS = {**CI_BOUNDS, **LONG_BOUNDS}

Quiet = Callable[[cluster.Cluster, Action], bool]


def _local(c: cluster.Cluster, a: Action) -> bool:
    return a.kind in (Kind.FIRE, Kind.TRAIN)


def _stable(c: cluster.Cluster, a: Action) -> bool:
    if _local(c, a):
        return True
    if a.kind is not Kind.DELIVER:
        return False
    cmd = c.inflight[index_of(c, a)].command
    return isinstance(cmd, Get | Probe) and c.store.get(cmd.key) is not None


def _reads(c: cluster.Cluster, a: Action) -> bool:
    if _local(c, a):
        return True
    if a.kind is not Kind.DELIVER:
        return False
    return isinstance(c.inflight[index_of(c, a)].command, Get | Probe | List)


EXPERIMENTS: dict[str, Quiet] = {"local": _local, "stable": _stable, "reads": _reads}


@contextmanager
def one_node_first(quiet: Quiet) -> Iterator[None]:
    """Explore with one node's actions taken alone wherever all of them are ``quiet``
    (and no crash, restart, forgery or clock move is enabled)."""
    real: Callable[..., list[Action]] = getattr(ex, "enabled")  # noqa: B009 (not exported)

    def enabled(c: cluster.Cluster, **kw: Any) -> list[Action]:
        acts = real(c, **kw)
        if any(a.kind not in (Kind.DELIVER, Kind.FIRE, Kind.TRAIN) for a in acts):
            return acts
        for node in sorted({a.node for a in acts}):
            mine = [a for a in acts if a.node == node]
            if len(mine) < len(acts) and all(quiet(c, a) for a in mine):
                return mine
        return acts

    setattr(ex, "enabled", enabled)  # noqa: B010
    try:
        yield
    finally:
        setattr(ex, "enabled", real)  # noqa: B010


@contextmanager
def every_state(sink: list[cluster.Cluster]) -> Iterator[None]:
    """Collect every state the search admits (each is judged once)."""
    real = ex._Search._judge

    def judge(self: Any, c: cluster.Cluster) -> Any:
        sink.append(c)
        return real(self, c)

    ex._Search._judge = judge  # type: ignore[method-assign]
    try:
        yield
    finally:
        ex._Search._judge = real  # type: ignore[method-assign]


def symmetries(bounds: ex.Bounds) -> int:
    """How many permutations of node names the protocol could not tell apart, at most."""
    crashable = set(bounds.crashable)
    classes = Counter(
        (code, not crashable or f"n{i}" in crashable)
        for i, code in enumerate(bounds.roles)
        if i > 0
    )
    return math.prod(math.factorial(n) for n in classes.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sets", nargs="*", help=f"bound sets (default: the CI sets): {', '.join(SETS)}")
    args = p.parse_args()
    if unknown := [n for n in args.sets if n not in SETS]:
        p.error(f"unknown bound sets: {unknown}")
    for name in args.sets or CI_BOUNDS:
        bounds = attrs.evolve(SETS[name], liveness=False)  # liveness judges, it adds no state
        states: list[cluster.Cluster] = []
        cpu = time.process_time()
        with every_state(states):
            full = ex.explore(bounds)
        cpu = time.process_time() - cpu
        prints = Fingerprinter()
        clockless = len({prints.state(attrs.evolve(c, now_s=0.0)) for c in states})
        clocks = len({c.now_s for c in states})
        line = (
            f"{name}: {full.states:,} states ({full.states / cpu:,.0f}/cpu-s), "
            f"{clocks} clock values, {clockless:,} without the clock, "
            f"symmetry <= {symmetries(bounds)}x"
        )
        for label, quiet in EXPERIMENTS.items():
            cpu = time.process_time()
            with one_node_first(quiet):
                reduced = ex.explore(bounds)
            cpu = time.process_time() - cpu
            line += (
                f"; {label} {reduced.states:,} (x{full.states / reduced.states:.1f},"
                f" {reduced.states / cpu:,.0f}/cpu-s)"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
