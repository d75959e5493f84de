"""``gm simulate``: run the deterministic simulator from flags or a scenario file.

Theory of operation
-------------------
The simulator itself is pure (:mod:`gm_core.sim`); this module is its shell. It
builds a :class:`~gm_core.sim.scenario.Scenario` — from a JSON or TOML file
(``--scenario``), from a swarm seed (``--swarm``), or from flags over the
defaults — runs it with a progress bar on stderr (on a terminal, or with
``--progress``), and prints a summary table. A bad flag value or an unreadable
scenario file is a usage error (exit status 2), reported before anything runs.
Two named studies have their own switches: ``--chaos-table`` reproduces the
Decoupled DiLoCo paper's goodput table next to the paper's numbers (its cells run
in parallel processes, one per core, each from its own seed, so the result does
not depend on the number of processes), and ``--heterogeneity`` runs the
quorum/grace study. ``--plot out.png`` draws what is better looked at than read;
``--save scenario.json`` writes the exact scenario so a run can be replayed.
A run that breaks an invariant prints the violation, the last actions and the
command that replays it, and exits with status 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from gm_core.records import Alignment
from gm_core.sim import chaos, experiments, scenario, swarm, world
from gm_core.sim.metrics import Summary
from gm_core.sim.scenario import CheckPolicy, Scenario
from gm_shell.argtypes import (
    add_progress_flags,
    existing_file,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    progress_wanted,
    usage_error,
)
from gm_shell.extras import MissingExtraError, require

_FLEET_ACTIONS: list[argparse.Action] = []
"""The scenario flags, kept to print the command that replays a run."""


def register(p: argparse.ArgumentParser) -> None:
    """Add ``gm simulate``'s flags to its subparser."""
    source = p.add_argument_group("what to run (default: a scenario from the flags below)")
    source.add_argument("--scenario", type=existing_file, help="scenario file (.json or .toml)")
    source.add_argument(
        "--swarm", type=non_negative_int, metavar="SEED", help="the swarm scenario of SEED"
    )
    source.add_argument("--chaos-table", action="store_true", help="the paper's goodput table")
    source.add_argument("--heterogeneity", action="store_true", help="the quorum/grace study")
    fleet = p.add_argument_group("scenario flags")
    fleet.add_argument("--seed", type=non_negative_int, default=0)
    fleet.add_argument("--learners", type=positive_int, default=4)
    fleet.add_argument("--closers", type=positive_int, default=1)
    fleet.add_argument("--duration", type=positive_float, default=600.0, help="virtual seconds")
    fleet.add_argument("--sync-every", type=positive_int, default=20, help="H, steps per cycle")
    fleet.add_argument("--fragments", type=positive_int, default=2)
    fleet.add_argument("--quorum", type=positive_int, default=1)
    fleet.add_argument("--in-flight", type=positive_int, default=2)
    fleet.add_argument("--grace-gamma", type=non_negative_float, default=0.5)
    fleet.add_argument("--alignment", choices=[a.value for a in Alignment], default="overwrite")
    fleet.add_argument("--step-s", type=positive_float, default=1.0)
    fleet.add_argument("--jitter", type=non_negative_float, default=0.0, help="± share per step")
    fleet.add_argument("--slow-share", type=non_negative_float, default=0.0)
    fleet.add_argument("--slow-factor", type=positive_float, default=1.0)
    fleet.add_argument("--crash-per-h", type=non_negative_float, default=0.0, help="per node")
    fleet.add_argument("--down-s", type=non_negative_float, default=30.0)
    fleet.add_argument("--fail-rate", type=non_negative_float, default=0.0, help="failed requests")
    fleet.add_argument("--lost-rate", type=non_negative_float, default=0.0, help="lost replies")
    fleet.add_argument("--list-lag-s", type=non_negative_float, default=0.0)
    fleet.add_argument("--throttle-rps", type=positive_float, default=None)
    fleet.add_argument("--train", action="store_true", help="learners train a small MLP")
    fleet.add_argument("--check", choices=[c.value for c in CheckPolicy], default="every")
    _FLEET_ACTIONS[:] = list(fleet._group_actions)
    out = p.add_argument_group("output")
    out.add_argument("--plot", type=Path, help="write a PNG of the run")
    out.add_argument("--save", type=Path, help="write the scenario as JSON")
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_progress_flags(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    if args.plot is not None:
        try:
            require("--plot", ("matplotlib",))
        except MissingExtraError as error:
            print(f"gm simulate: {error}", file=sys.stderr)
            return 1
    if args.chaos_table:
        return _chaos_table(args)
    if args.heterogeneity:
        return _heterogeneity(args)
    try:
        chosen = _scenario(args)
    except (ValueError, OSError) as error:  # an unreadable or invalid scenario file
        return usage_error("simulate", str(error))
    quiet = not progress_wanted(args)
    if args.save:
        args.save.write_text(json.dumps(scenario.to_mapping(chosen), indent=2) + "\n")
    started = time.perf_counter()
    report = world.run(chosen, None if quiet else _Bar())
    elapsed = time.perf_counter() - started
    if not quiet:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(_summary_dict(report.summary), indent=2))
    else:
        print(_summary_table(chosen, report, elapsed))
    if args.plot:
        _plot_run(report.summary, args.plot, chosen.name)
        print(f"plot: {args.plot}")
    if not report.ok:
        print(_violation_text(report, args), file=sys.stderr)
        return 1
    return 0


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.scenario is not None:
        return scenario.from_mapping(_load(args.scenario))
    if args.swarm is not None:
        return swarm.scenario(args.swarm)
    base = Scenario()
    config = attrs.evolve(
        base.config,
        sync_every=args.sync_every,
        fragments=args.fragments,
        quorum=args.quorum,
        in_flight=args.in_flight,
        grace_gamma=args.grace_gamma,
        alignment=Alignment(args.alignment),
    )
    return attrs.evolve(
        base,
        seed=args.seed,
        learners=args.learners,
        closers=args.closers,
        duration_s=args.duration,
        config=config,
        store=attrs.evolve(
            base.store,
            fail_rate=args.fail_rate,
            lost_rate=args.lost_rate,
            list_lag_s=args.list_lag_s,
            throttle_rps=args.throttle_rps,
        ),
        speed=attrs.evolve(
            base.speed,
            step_s=args.step_s,
            jitter=args.jitter,
            slow_share=args.slow_share,
            slow_factor=args.slow_factor,
        ),
        random_faults=attrs.evolve(
            base.random_faults, crash_per_h=args.crash_per_h, down_s=args.down_s
        ),
        training=scenario.TrainingSpec() if args.train else None,
        check=CheckPolicy(args.check),
        sample_s=args.duration / 100,
    )


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    doc: dict[str, Any] = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    return doc


# --- progress and tables ------------------------------------------------------------------


class _Bar:
    """A one-line progress bar on stderr, redrawn when the whole percent changes."""

    def __init__(self) -> None:
        self.shown = -1

    def __call__(self, p: world.Progress) -> None:
        done = min(1.0, p.now_s / p.duration_s) if p.duration_s > 0 else 1.0
        percent = int(100 * done)
        if percent == self.shown:
            return
        self.shown = percent
        width = 30
        bar = "#" * int(done * width) + "-" * (width - int(done * width))
        line = f"\r[{bar}] {percent:3d}%  t={p.now_s:,.0f}s  records={p.records}"
        print(f"{line}  actions={p.actions:,}", end="", file=sys.stderr, flush=True)


def _rows(pairs: Sequence[tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in pairs)


def _summary_table(s: Scenario, report: world.Report, elapsed_s: float) -> str:
    m = report.summary
    cfg = s.config
    loss = "-" if m.final_loss is None else f"{m.final_loss:.4f}"
    pairs: list[tuple[str, object]] = [
        ("scenario", f"{s.name}  seed={s.seed}"),
        ("fleet", f"{s.learners} learners, {s.closers} closer(s)"),
        (
            "config",
            f"H={cfg.sync_every} P={cfg.fragments} quorum={cfg.quorum} "
            f"in_flight={cfg.in_flight} grace_gamma={cfg.grace_gamma} {cfg.alignment}",
        ),
        (
            "virtual time",
            f"{m.duration_s:,.0f} s  ({report.actions:,} actions in {elapsed_s:.1f} s)",
        ),
        ("records", f"{m.records}  ({m.rounds_per_h:,.1f} rounds/h)"),
        ("goodput", f"{100 * m.goodput:.1f}%  (middle of the run: {100 * m.settled_goodput:.1f}%)"),
        ("compute share", f"{100 * m.train_share:.1f}%   uptime {100 * m.uptime:.1f}%"),
        (
            "participants",
            f"mean {m.participants_mean:.2f}  min {m.participants_min}  "
            f"max {m.participants_max}  empty rounds {m.empty_rounds}",
        ),
        ("staleness", f"mean {m.staleness_mean:.2f}  max {m.staleness_max} versions"),
        ("rejections", _inline(m.rejections) or "none"),
        ("closers", f"{_inline(m.closers)}  takeovers {m.takeovers}"),
        ("requests", f"{_inline(m.requests)}  failed {_inline(m.failed_requests) or 'none'}"),
        ("request cost", f"${m.cost_usd:.4f} at S3 list prices"),
        ("final loss", loss),
        ("invariants", "all held" if report.ok else f"BROKEN: {report.violations[0].invariant}"),
        ("trace hash", report.trace_hash),
    ]
    return _rows(pairs)


def _inline(counts: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items())


def _summary_dict(m: Summary) -> dict[str, Any]:
    out = attrs.asdict(m, recurse=False)
    out.pop("samples")
    out["losses"] = [list(x) for x in m.losses]
    return out


def _violation_text(report: world.Report, args: argparse.Namespace) -> str:
    lines = [f"VIOLATION at t={report.violation_at_s:.3f}s:"]
    lines += [f"  {v.invariant}: {v.message}" for v in report.violations]
    lines += ["last actions:"] + [f"  {t}" for t in report.trace_tail]
    lines.append(f"replay: {replay_command(args)}")
    return "\n".join(lines)


def replay_command(args: argparse.Namespace) -> str:
    """The ``gm simulate`` command line that runs the same scenario again."""
    if args.scenario is not None:
        return f"gm simulate --scenario {shlex.quote(str(args.scenario))}"
    if args.swarm is not None:
        return f"gm simulate --swarm {args.swarm}"
    words = ["gm", "simulate"]
    for action in _FLEET_ACTIONS:
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        words += [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, str(value)]
    return shlex.join(words)


# --- the chaos table and the heterogeneity study -------------------------------------------


def _chaos_cell(item: tuple[str, int, int]) -> chaos.Cell:
    row, chips, seed = item
    return chaos.cell(row, chips, chaos.CALIBRATED, seed)


def _chaos_table(args: argparse.Namespace) -> int:
    model = chaos.CALIBRATED
    todo = [(row, chips, args.seed) for row, chips in chaos.cells()]
    started = time.perf_counter()
    workers = max(1, min(len(todo), os.cpu_count() or 1))
    quiet = not progress_wanted(args)
    done: list[chaos.Cell] = []
    # Slowest cells (most learners) first, so the pool's tail is short.
    order = sorted(todo, key=lambda t: -_cost(t[0]))
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(_chaos_cell, order):
            done.append(result)
            if not quiet:
                print(f"\r{len(done)}/{len(todo)} cells", end="", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    if not quiet:
        print(file=sys.stderr)
    table = chaos.Table(model=model, cells=tuple(sorted(done, key=_reading_order)))
    print(format_chaos_table(table, elapsed, workers))
    if args.plot:
        _plot_chaos(table, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _cost(row: str) -> int:
    return int(row.removeprefix("M=")) if row.startswith("M=") else 0


def _reading_order(c: chaos.Cell) -> tuple[int, int]:
    return chaos.ROWS.index(c.row), chaos.CHIPS.index(c.chips)


def format_chaos_table(table: chaos.Table, elapsed_s: float, workers: int) -> str:
    """Our goodput beside the paper's, per cell, with the calibration stated."""
    m = table.model
    head = "goodput %          " + "".join(f"{c // 1000:>6}k" for c in chaos.CHIPS)
    lines = [head]
    for row in table.rows():
        ours = "".join(f"{100 * table.cell(row, c).goodput:7.1f}" for c in chaos.CHIPS)
        paper = "".join(f"{table.cell(row, c).paper:7.0f}" for c in chaos.CHIPS)
        lines.append(f"{row:<11} ours  {ours}")
        lines.append(f"{'':<11} paper {paper}")
        if row.startswith("M="):
            kept = "".join(f"{100 * (table.cell(row, c).committed or 0):7.1f}" for c in chaos.CHIPS)
            lines.append(f"{'':<11} commit{kept}")
    lines += [
        f"worst cell: {table.worst_error:+.1f} points off the paper (goal: within 5)",
        f"time: {elapsed_s:.1f} s on {workers} process(es)",
        "model: chip MTBI 1 year; checkpoints every sqrt(2C/lambda) s of work (Young);",
        f"  calibration: checkpoint cost C = {m.checkpoint_s:g} s, DP restart"
        f" {m.dp_restart_s:g} s, elastic reconfiguration {m.elastic_reconfig_s:g} s;",
        f"  M learners = elastic groups of chips/M through the real protocol: quorum 1,"
        f" {m.alignment} alignment, {m.rounds} rounds of {m.round_s:g} s;",
        "  'ours' counts chip time on work that survived failures, as the paper does;",
        "  'commit' is the share the protocol then committed (it also drops late deltas)",
    ]
    return "\n".join(lines)


def _heterogeneity(args: argparse.Namespace) -> int:
    learners = args.learners if args.learners != 4 else 8
    started = time.perf_counter()
    alignment = Alignment(args.alignment)
    arms = experiments.heterogeneity(learners, args.duration, args.seed, alignment)
    elapsed = time.perf_counter() - started
    print(format_heterogeneity(arms, learners, args.duration, elapsed, alignment))
    if args.plot:
        _plot_heterogeneity(arms, args.plot)
        print(f"plot: {args.plot}")
    return 0 if all(a.ok for a in arms) else 1


def format_heterogeneity(
    arms: Sequence[experiments.Arm],
    learners: int,
    duration_s: float,
    elapsed_s: float,
    alignment: Alignment,
) -> str:
    lines = [
        f"{learners} learners, half 18% slower, ±10% jitter per step; {duration_s:g} s each;"
        f" {alignment} alignment",
        f"{'arm':<22}{'goodput':>9}{'final loss':>12}{'rounds/h':>10}{'particip.':>11}"
        f"{'rejected':>10}",
    ]
    for a in arms:
        loss = "-" if a.final_loss is None else f"{a.final_loss:.4f}"
        lines.append(
            f"{a.name:<22}{100 * a.goodput:8.1f}%{loss:>12}{a.rounds_per_h:10.0f}"
            f"{a.participants:11.2f}{a.rejected:10d}"
        )
    lines.append(f"time: {elapsed_s:.1f} s")
    return "\n".join(lines)


# --- plots -----------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_run(m: Summary, path: Path, title: str) -> None:
    plt = _pyplot()
    panels = 2 if m.losses else 1
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels), squeeze=False)
    ax = axes[0][0]
    ax.plot([s.time_s for s in m.samples], [100 * s.goodput for s in m.samples])
    ax.set_ylabel("goodput so far (%)")
    ax.set_xlabel("virtual time (s)")
    ax.set_title(title)
    if m.losses:
        ax = axes[1][0]
        ax.plot([t for t, _, _ in m.losses], [x for _, _, x in m.losses])
        ax.set_yscale("log")
        ax.set_ylabel("test loss of the committed model")
        ax.set_xlabel("virtual time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_chaos(table: chaos.Table, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [c / 1e6 for c in chaos.CHIPS]
    for i, row in enumerate(table.rows()):
        color = f"C{i}"
        ax.plot(
            xs,
            [100 * table.cell(row, c).goodput for c in chaos.CHIPS],
            "o-",
            color=color,
            label=f"{row} (ours)",
        )
        ax.plot(xs, [table.cell(row, c).paper for c in chaos.CHIPS], "x--", color=color, alpha=0.6)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{c // 1000}k" for c in chaos.CHIPS])
    ax.set_xlabel("chips (per-chip MTBI 1 year)")
    ax.set_ylabel("goodput (%)")
    ax.set_title("goodput: ours (solid) vs the paper (dashed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_heterogeneity(arms: Sequence[experiments.Arm], path: Path) -> None:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = [a.name for a in arms]
    left.bar(names, [100 * a.goodput for a in arms])
    left.set_ylabel("goodput (%)")
    right.bar(names, [a.final_loss or 0.0 for a in arms])
    right.set_ylabel("final test loss")
    right.set_yscale("log")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
