"""``gm check``: model-check the protocol at small bounds, or replay a counterexample.

Theory of operation
-------------------
The checker is pure (:mod:`gm_core.check`); this is its shell: bounds from flags,
a progress line on stderr when it is a terminal or ``--progress`` asks (depth,
states, states per second — the only place a clock is read), and a verdict. A
counterexample is printed as a numbered trace with the command that replays it
(``--replay`` with the same bounds re-runs the actions one by one, narrating
each, and judges every invariant at the end).
``--ci`` runs the bound sets that ``make test`` pins (``gm_core.check.bounds``: the
protocol's, then the shared queue's, the ranks' and the barrier's, explored by their own
searches and reported as "coordination" sets) and ends with one summary line
(``6/6 bound sets PASS, N states``); ``--jobs`` explores that many
sets at once, each in a process of its own (a search is one process's tables, so the
sets are what is spread over the cores), and prints the verdicts in the sets' order,
so the output is the same whatever finishes first. ``--plant NAME`` explores one planted
bug's bound set with its rule broken (:mod:`gm_core.check.plants`, the protocol's and the
coordination sets' alike) and says whether the verdict is the one the plants' table
lists (exit status 0 when it is). Flag values are
checked by argparse (exit status 2, like an unreadable ``--replay``).

Exit status: 0 when every explored state is sound, 1 on a counterexample, 3 when
``--max-states`` stopped the search first.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, overload

import attrs

from gm_core import cluster
from gm_core.check import actions, barrier, plants, queue, search
from gm_core.check.bounds import (
    CI_BOUNDS,
    COORDINATION_BOUNDS,
    COORDINATION_LONG_BOUNDS,
    DEEP_BOUNDS,
    LONG_BOUNDS,
)
from gm_core.check.explore import ROLE_CODES, Bounds, ExploreProgress, Outcome, explore, narrate
from gm_core.records import Alignment
from gm_core.sim import checks
from gm_shell.argtypes import (
    add_progress_flags,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    progress_wanted,
    usage_error,
)

_D = Bounds()


def _roles(text: str) -> str:
    """Comma-separated node codes, each a non-empty mix of ``l`` and ``c`` (``lc,lc,l``)."""
    codes = [r.strip() for r in text.split(",") if r.strip()]
    if not codes or any(not code or set(code) - set(ROLE_CODES) for code in codes):
        raise argparse.ArgumentTypeError(
            f"expected node codes of l (learner) and c (closer) such as lc,lc,l; got {text!r}"
        )
    return text


def _node_names(text: str) -> str:
    """Comma-separated node names such as ``n0,n1`` (empty: every node)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if any(not n.startswith("n") or not n[1:].isdigit() for n in names):
        raise argparse.ArgumentTypeError(f"expected node names such as n0,n1; got {text!r}")
    return text


FLAGS: tuple[tuple[str, str, Callable[[str], object], object, str], ...] = (
    ("--roles", "roles", _roles, ",".join(_D.roles), "nodes: l=learner c=closer, e.g. lc,lc,l"),
    ("--rounds", "rounds", positive_int, _D.rounds, "stop once this many records exist"),
    ("--max-time", "max_time_s", positive_float, _D.max_time_s, "virtual seconds to reach"),
    ("--crashes", "crashes", non_negative_int, _D.crashes, "crashes on any path"),
    (
        "--crashable",
        "crashable",
        _node_names,
        "",
        "nodes that may crash, e.g. n0,n1 (default: all)",
    ),
    ("--faults", "faults", non_negative_int, _D.faults, "failed/lost requests on any path"),
    ("--sync-every", "sync_every", positive_int, _D.sync_every, "H"),
    ("--fragments", "fragments", positive_int, _D.fragments, "P"),
    ("--quorum", "quorum", positive_int, _D.quorum, "minimum quorum"),
    ("--in-flight", "in_flight", positive_int, _D.in_flight, "rounds a learner may run ahead"),
    ("--lease-timeout", "lease_timeout_s", positive_float, _D.lease_timeout_s, "seconds"),
    ("--takeover-floor", "takeover_floor_s", non_negative_float, _D.takeover_floor_s, "seconds"),
    ("--poll", "poll_s", positive_float, _D.poll_s, "node poll interval, seconds"),
    ("--renew", "renew_s", positive_float, _D.renew_s, "lease renewal interval, seconds"),
    (
        "--progress-every",
        "progress_every",
        non_negative_int,
        _D.progress_every,
        "also judge progress from every N-th state (0: only where exploration stops)",
    ),
    (
        "--progress-within",
        "progress_within_s",
        positive_float,
        _D.progress_within_s,
        "virtual seconds a fair run has to commit (progress and liveness)",
    ),
    ("--max-states", "max_states", positive_int, _D.max_states, "give up after this many states"),
    (
        "--delays",
        "delays",
        non_negative_int,
        _D.delays,
        "explore only runs that leave the fair schedule at most N times (default: every run)",
    ),
)
"""The bound flags: flag, Bounds field, parser, default, help."""

EXIT = {
    "pass": 0,
    "violation": 1,
    "no progress": 1,
    "not live": 1,
    "exception": 1,
    "incomplete": 3,
}


def register(p: argparse.ArgumentParser) -> None:
    """Add ``gm check``'s flags to its subparser."""
    for flag, dest, kind, default, text in FLAGS:
        p.add_argument(flag, dest=dest, type=kind, default=default, help=text)
    p.add_argument("--alignment", choices=[a.value for a in Alignment], default=_D.alignment.value)
    p.add_argument(
        "--reorder",
        action="store_true",
        help="let one machine's requests complete in any order (default: in order)",
    )
    p.add_argument(
        "--no-atomic-payloads",
        action="store_true",
        help="interleave payload work (capture, verify, merge, align) too",
    )
    p.add_argument(
        "--capture-faults",
        action="store_true",
        help="let a learner's Capture fail too (it gives the round up)",
    )
    p.add_argument(
        "--no-store-faults",
        action="store_true",
        help="spend the fault budget on captures only (with --capture-faults)",
    )
    p.add_argument(
        "--liveness",
        action="store_true",
        help="from every state, the healed fair run must commit within --progress-within",
    )
    p.add_argument("--replay", metavar="ACTIONS", help="replay a counterexample's actions")
    p.add_argument(
        "--plant",
        choices=sorted(plants.PLANTS),
        help="explore a planted bug's bound set with its rule broken: is it caught as listed?",
    )
    p.add_argument("--ci", action="store_true", help="check the bound sets make test pins")
    p.add_argument("--long", action="store_true", help="check the larger bound sets too")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=min(2, os.cpu_count() or 1),
        help="with --ci/--long: bound sets explored at once, one process each (default: 2)",
    )
    add_progress_flags(p)
    p.set_defaults(handler=main)


def bounds_of(args: argparse.Namespace) -> Bounds:
    values = {dest: getattr(args, dest) for _, dest, *_ in FLAGS}
    for listed in ("roles", "crashable"):
        values[listed] = tuple(r.strip() for r in str(values[listed]).split(",") if r.strip())
    return Bounds(
        **values,
        capture_faults=args.capture_faults,
        store_faults=not args.no_store_faults,
        liveness=args.liveness,
        alignment=Alignment(args.alignment),
        fifo=not args.reorder,
        atomic_payloads=not args.no_atomic_payloads,
    )


CoordinationBounds = queue.QueueBounds | barrier.BarrierBounds
AnyBounds = Bounds | CoordinationBounds


@attrs.frozen(kw_only=True)
class CoordinationOutcome:
    """A coordination set's verdict (:mod:`gm_core.check.search`: states, and the first
    violation with its shortest trace), as the summary line counts it."""

    verdict: str  # "pass" or "violation"
    states: int
    violation: tuple[str, ...] = ()
    trace: tuple[object, ...] = ()


AnyOutcome = Outcome | CoordinationOutcome


def explore_coordination(bounds: CoordinationBounds) -> CoordinationOutcome:
    """Explore a queue/ranks or barrier set with its own search."""
    found: search.Outcome[Any]
    if isinstance(bounds, queue.QueueBounds):
        found = queue.explore(bounds)
    else:
        found = barrier.explore(bounds)
    verdict = "violation" if found.violation else "pass"
    return CoordinationOutcome(
        verdict=verdict, states=found.states, violation=found.violation, trace=found.trace
    )


def main(args: argparse.Namespace) -> int:
    quiet = not progress_wanted(args)
    if args.plant is not None:
        return judge_plant(plants.PLANTS[args.plant], quiet=quiet)
    if args.ci or args.long:
        sets: dict[str, AnyBounds] = {
            **CI_BOUNDS,
            **({**LONG_BOUNDS, **DEEP_BOUNDS} if args.long else {}),
            **COORDINATION_BOUNDS,
            **(COORDINATION_LONG_BOUNDS if args.long else {}),
        }
        if args.jobs > 1:
            results = run_many(sets, args.jobs)
        else:
            results = [run(name, b, quiet=quiet) for name, b in sets.items()]
        print(summary_line(results))
        return max(EXIT[o.verdict] for o in results)
    bounds = bounds_of(args)
    if args.replay is not None:
        try:
            path = parse_replay(args.replay)
        except ValueError as error:
            return usage_error("check", f"argument --replay: {error}")
        return replay(bounds, path)
    return EXIT[run("check", bounds, quiet=quiet).verdict]


def judge_plant(plant: plants.Plant, *, quiet: bool = True) -> int:
    """Explore ``plant``'s bound set with its rule broken, print the verdict (and trace) and
    whether it is the one the table lists; exit status 0 when it is."""
    with plants.planted(plant):
        outcome = run(f"planted {plant.name}", plant.bounds, quiet=quiet)
    found = outcome.verdict != "pass"
    listed = "caught" if plant.caught else f"missed ({plant.why_missed})"
    print(f"{plant.name}: {'caught' if found else 'missed'}; the table says {listed}")
    return 0 if found == plant.caught else 1


def summary_line(outcomes: Sequence[AnyOutcome]) -> str:
    """``6/6 bound sets PASS, 15,224 states`` (and the other verdicts' counts, if any)."""
    verdicts = Counter(o.verdict for o in outcomes)
    passed = verdicts.pop("pass", 0)
    others = "".join(f", {n} {v.upper()}" for v, n in sorted(verdicts.items()))
    states = sum(o.states for o in outcomes)
    return f"{passed}/{len(outcomes)} bound sets PASS{others}, {states:,} states"


def parse_replay(tokens: str) -> tuple[actions.Action, ...]:
    """The actions of a ``--replay`` argument; ValueError names the token it cannot read."""
    path = []
    for token in (t for t in tokens.split(",") if t.strip()):
        try:
            path.append(actions.parse(token))
        except ValueError as error:
            raise ValueError(f"cannot read action {token.strip()!r} ({error})") from None
    return tuple(path)


@overload
def run(name: str, bounds: Bounds, *, quiet: bool = False) -> Outcome: ...


@overload
def run(name: str, bounds: CoordinationBounds, *, quiet: bool = False) -> CoordinationOutcome: ...


def run(name: str, bounds: AnyBounds, *, quiet: bool = False) -> AnyOutcome:
    """Explore ``bounds``, print the verdict (and any counterexample), return the outcome."""
    started = time.perf_counter()
    if not isinstance(bounds, Bounds):
        found = explore_coordination(bounds)
        print(format_outcome(name, bounds, found, time.perf_counter() - started))
        return found

    def progress(p: ExploreProgress) -> None:
        rate = p.states / max(time.perf_counter() - started, 1e-9)
        line = f"\r{name}: depth {p.depth}  states {p.states:,}  frontier {p.frontier:,}"
        print(f"{line}  {rate:,.0f} states/s", end="", file=sys.stderr, flush=True)

    outcome = explore(bounds, None if quiet else progress)
    elapsed = time.perf_counter() - started
    if not quiet:
        print(file=sys.stderr)
    print(format_outcome(name, bounds, outcome, elapsed))
    return outcome


def _timed(bounds: AnyBounds) -> tuple[AnyOutcome, float]:
    started = time.perf_counter()
    outcome = explore(bounds) if isinstance(bounds, Bounds) else explore_coordination(bounds)
    return outcome, time.perf_counter() - started


def run_many(sets: Mapping[str, AnyBounds], jobs: int) -> list[AnyOutcome]:
    """Explore the sets ``jobs`` at a time in worker processes; print each verdict in order."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited state
    outcomes = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for (name, bounds), (outcome, elapsed_s) in zip(
            sets.items(), pool.map(_timed, sets.values()), strict=True
        ):
            print(format_outcome(name, bounds, outcome, elapsed_s), flush=True)
            outcomes.append(outcome)
    return outcomes


def format_outcome(name: str, bounds: AnyBounds, o: AnyOutcome, elapsed_s: float) -> str:
    rate = o.states / elapsed_s if elapsed_s > 0 else 0.0
    if not isinstance(o, Outcome) or not isinstance(bounds, Bounds):
        return _format_coordination(name, bounds, o, elapsed_s, rate)
    lines = [
        f"{name}: {o.verdict.upper()}  {o.states:,} states, {o.transitions:,} transitions,"
        f" depth {o.depth}, {o.progress_checks:,} progress checks, {o.fair_runs:,} fair runs,"
        f" up to {o.max_records} records; {elapsed_s:.1f} s ({rate:,.0f} states/s)",
        f"  bounds: {describe_bounds(bounds)}",
    ]
    if o.counterexample is not None:
        lines.append(f"  shortest counterexample ({o.counterexample.kind}):")
        lines += [f"    {line}" for line in o.counterexample.lines]
        lines.append(f"  replay: {replay_command(bounds, o.counterexample.replay_arg())}")
    return "\n".join(lines)


def _format_coordination(
    name: str, bounds: AnyBounds, o: AnyOutcome, elapsed_s: float, rate: float
) -> str:
    lines = [
        f"{name}: {o.verdict.upper()}  {o.states:,} states;"
        f" {elapsed_s:.1f} s ({rate:,.0f} states/s)",
        f"  bounds: {bounds!r}",
    ]
    if isinstance(o, CoordinationOutcome) and o.violation:
        lines += [f"  violated: {v}" for v in o.violation]
        lines.append(f"  shortest trace ({len(o.trace)} actions): {list(o.trace)}")
    return "\n".join(lines)


def describe_bounds(b: Bounds) -> str:
    order = "any order" if not b.fifo else "in order per machine"
    return (
        f"roles={','.join(b.roles)} rounds={b.rounds} max_time={b.max_time_s:g}s"
        f" crashes={b.crashes} faults={b.faults} H={b.sync_every} P={b.fragments}"
        f" quorum={b.quorum} in_flight={b.in_flight} {b.alignment}; requests complete {order}"
        + (f"; only {','.join(b.crashable)} may crash" if b.crashable else "")
        + ("; captures may fail" if b.capture_faults else "")
        + ("" if b.store_faults else "; store requests do not fail")
        + ("; liveness from every state" if b.liveness else "")
        + ("" if b.delays is None else f"; DELAY-BOUNDED: runs with at most {b.delays} delays")
    )


def replay_command(b: Bounds, tokens: str) -> str:
    words = ["gm", "check"]
    defaults = Bounds()
    for flag, dest, *_ in FLAGS:
        value = getattr(b, dest)
        if value != getattr(defaults, dest):
            words += [flag, ",".join(value) if isinstance(value, tuple) else str(value)]
    if b.alignment is not defaults.alignment:
        words += ["--alignment", b.alignment.value]
    if b.capture_faults:
        words.append("--capture-faults")
    if not b.store_faults:
        words.append("--no-store-faults")
    if b.liveness:
        words.append("--liveness")
    if not b.fifo:
        words.append("--reorder")
    if not b.atomic_payloads:
        words.append("--no-atomic-payloads")
    return shlex.join([*words, "--replay", tokens])


def replay(bounds: Bounds, path: Sequence[actions.Action] | str) -> int:
    """Re-run the actions, narrating each, and judge every invariant at the end."""
    if isinstance(path, str):
        path = parse_replay(path)
    lines, end = narrate(bounds, tuple(path))
    print("\n".join(lines))
    if end is None:
        return 1
    broken = checks.recorded(end) + checks.judge(cluster.view(end), checks.store_part())
    broken += checks.judge(cluster.view(end), checks.node_part())
    for v in broken:
        print(f"VIOLATED {v.invariant}: {v.message}")
    print(f"{len(cluster.records(end))} records; " + ("invariants hold" if not broken else ""))
    return 1 if broken else 0
