"""The model checker's speed: two checkouts' ``gm_core.check`` on the same bound sets, in one run.

Speed figures here are ratios measured side by side, since the machine's load
varies: for each bound set, each checkout explores it in a fresh process, one
after the other, and the figure is states per CPU-second (CPU time, which load
distorts less than wall time; wall time is printed too). The state counts must
match: a change that speeds the checker up may not change what it explores.

    git worktree add --detach /tmp/gm-before <commit>
    .venv/bin/python bench/bench_check.py /tmp/gm-before/src src [set names...]
    .venv/bin/python bench/bench_check.py --suite /tmp/gm-before/src src [set names...]

``--suite`` measures the checker as ``gm check`` runs it, on the machine's cores: the
sets as one suite, a fresh process per set, ``--jobs`` of them at a time (``gm check``'s
``--jobs``, default 2), and the figure is the suite's states per wall-clock second. The
earlier checkout is timed twice: one set at a time (what a ``gm check`` without
``--jobs`` did) and ``--jobs`` at a time (the same driver as today's: the engines alone
compared), alternating with today's ``--repeat`` times.

The bound sets are those both checkouts can express: the six original CI sets, two
larger ones, and (for checkouts from 3be8caf on, which have crash sets and the
liveness check) three with liveness; two long sets run only when named (``LONG_SETS``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SETS: dict[str, dict[str, object]] = {
    "one node, one fault": {"roles": ["lc"], "rounds": 1, "max_time_s": 1.0, "faults": 1},
    "one node, one crash": {"roles": ["lc"], "rounds": 1, "max_time_s": 1.0, "crashes": 1},
    "learner and closer apart": {"roles": ["l", "c"], "rounds": 1, "max_time_s": 1.0},
    "two learners, one closes": {"roles": ["lc", "l"], "rounds": 1, "max_time_s": 0.5},
    "two closers race for round 0": {"roles": ["lc", "c"], "rounds": 1, "max_time_s": 0.5},
    "two closers race, one fault": {
        "roles": ["lc", "c"],
        "rounds": 1,
        "max_time_s": 0.5,
        "faults": 1,
    },
    "three closers contend for round 0": {
        "roles": ["lc", "c", "c"],
        "rounds": 1,
        "max_time_s": 0.5,
    },
    "three nodes, two fragments": {
        "roles": ["lc", "l", "l"],
        "fragments": 2,
        "rounds": 1,
        "max_time_s": 0.5,
    },
    "the closer crashes and restarts across two rounds": {
        "roles": ["l", "c"],
        "rounds": 2,
        "max_time_s": 1.0,
        "crashes": 1,
        "crashable": ["n1"],
        "liveness": True,
    },
    "a learner dies for good, quorum 2": {
        "roles": ["lc", "l"],
        "quorum": 2,
        "rounds": 1,
        "max_time_s": 0.5,
        "crashes": 1,
        "crashable": ["n1"],
        "liveness": True,
    },
    "one closer, a learner gives a round up": {
        "roles": ["lc", "l"],
        "quorum": 2,
        "rounds": 1,
        "max_time_s": 0.5,
        "faults": 1,
        "capture_faults": True,
        "store_faults": False,
        "liveness": True,
    },
}

LONG_SETS: dict[str, dict[str, object]] = {
    "two learners, one closes, through a poll": {
        "roles": ["lc", "l"],
        "rounds": 1,
        "max_time_s": 1.0,
    },
    "one node, two rounds": {"roles": ["lc"], "rounds": 2, "max_time_s": 2.0},
}
"""Two of ``make check-long``'s sets (hundreds of thousands of states, minutes each): run
only when named. A search's heap grows with its states, so what depends on heap size (the
garbage collector) shows here more than on the CI sets."""

CHILD = """
import json, sys, time
from gm_core.check.explore import Bounds, explore
kw = json.loads(sys.argv[1])
kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
cpu, wall = time.process_time(), time.perf_counter()
o = explore(Bounds(**kw))
print(json.dumps([o.verdict, o.states, time.process_time() - cpu, time.perf_counter() - wall]))
"""


def measure(src: Path, bounds: dict[str, object]) -> tuple[str, int, float, float]:
    """Explore ``bounds`` with the checker under ``src``: verdict, states, CPU s, wall s."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(bounds)],
        env={"PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    verdict, states, cpu_s, wall_s = json.loads(out)
    return str(verdict), int(states), float(cpu_s), float(wall_s)


def suite(src: Path, sets: list[dict[str, object]], jobs: int) -> tuple[int, float]:
    """The sets' states and the wall seconds to explore them all, ``jobs`` sets at a time
    (each in a process of its own, as ``gm check --jobs`` runs them)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(lambda bounds: measure(src, bounds), sets))
    return sum(o[1] for o in outcomes), time.perf_counter() - started


def compare_suites(before: Path, after: Path, sets: list[dict[str, object]], jobs: int) -> None:
    runs = [("before, one set at a time", before, 1), (f"before, {jobs} at a time", before, jobs)]
    runs.append((f"after, {jobs} at a time", after, jobs))
    rates = {}
    for label, src, n in runs:
        states, wall_s = suite(src, sets, n)
        rates[label] = states / wall_s
        print(
            f"  {label:28s} {states:>9,} states {wall_s:7.1f} s  {rates[label]:7,.0f}/s", flush=True
        )
    now = rates[runs[2][0]]
    print(
        f"  x{now / rates[runs[0][0]]:.1f} against one set at a time,"
        f" x{now / rates[runs[1][0]]:.1f} against the same driver",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the src folder of the checkout to compare against")
    p.add_argument("after", type=Path, help="the src folder of this checkout")
    p.add_argument(
        "sets",
        nargs="*",
        help=f"bound sets (default: all but the long ones): {', '.join({**SETS, **LONG_SETS})}",
    )
    p.add_argument("--suite", action="store_true", help="the sets as one suite, wall time")
    p.add_argument("--jobs", type=int, default=2, help="sets at a time with --suite")
    p.add_argument("--repeat", type=int, default=1, help="suite comparisons, alternating")
    args = p.parse_args()
    known = {**SETS, **LONG_SETS}
    if unknown := [n for n in args.sets if n not in known]:
        p.error(f"unknown bound sets: {unknown}")
    if args.suite:
        chosen = [known[name] for name in args.sets or SETS]
        for _ in range(args.repeat):
            compare_suites(args.before, args.after, chosen, args.jobs)
        return
    for name in args.sets or SETS:
        before = measure(args.before, known[name])
        after = measure(args.after, known[name])
        rate_b, rate_a = before[1] / before[2], after[1] / after[2]
        same = "" if before[:2] == after[:2] else f"  DIFFERENT: {before[:2]} vs {after[:2]}"
        print(
            f"{name:34s} {after[1]:>7,} states  before {rate_b:6,.0f}/cpu-s ({before[3]:5.1f} s)"
            f"  after {rate_a:6,.0f}/cpu-s ({after[3]:5.1f} s)  x{rate_a / rate_b:.1f}{same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
