"""Chaos at scale: the Decoupled DiLoCo paper's goodput table, from a calibrated failure model.

Theory of operation
-------------------
Every chip fails on its own, as a Poisson process with a mean time between
interruptions of one year, so a job of ``n`` chips is interrupted at rate
``λ = n / MTBI``. What an interruption costs depends on how the job recovers,
and that is the whole difference between the table's rows:

* **data-parallel** (DP): the job stops, restarts (``dp_restart_s``: reschedule,
  replace the host, reload) and resumes from its last checkpoint, which it takes
  every ``τ = √(2·C/λ)`` seconds of work (Young's optimal interval) at a cost of
  ``C = checkpoint_s`` each;
* **elastic DP**: the job drops the failed slice and reconfigures around it
  (``elastic_reconfig_s``), rolling back to its last checkpoint, taken the same
  way;
* **Decoupled DiLoCo with M learners**: each learner is an elastic DP group of
  ``n/M`` chips, interrupted at ``λ/M``; an interruption pauses that learner
  alone while the others keep training and the closer keeps committing with a
  quorum of one. The pauses become :class:`~gm_core.sim.scenario.Fault` entries
  of a :class:`~gm_core.sim.scenario.Scenario` and the real learner and closer
  machines run it (:func:`gm_core.sim.world.run`). Each cell reports two shares:
  chip time spent on work that survived failures (what the paper, and the DP
  rows here, call goodput — stalls the protocol causes count against it), and
  the share the protocol then *committed*, which also charges the deltas it
  dropped (a straggler whose snapshot misses its round by seconds loses it).

The recovery of one group is simulated event by event (:func:`group_outages`):
the interruptions, the work lost since the last checkpoint, the restart; a
failure during a restart is absorbed by it. Goodput is the share of the chips'
time spent on work that survives. The three recovery constants (checkpoint cost,
DP restart, elastic reconfiguration) are the model's only calibration, fitted
once by grid search to the paper's DP and elastic-DP rows and stated in
:data:`CALIBRATED`; the learner rows then follow with nothing tuned.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

from gm_core.records import AlgorithmConfig, Alignment
from gm_core.sim import world
from gm_core.sim.scenario import CheckPolicy, Fault, FaultKind, Scenario, SpeedProfile
from gm_core.sim.speed import learner_names

YEAR_S = 365.25 * 86400.0
CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
LEARNER_ROWS = (2, 4, 8, 16)
PAPER: dict[str, tuple[int, ...]] = {
    "DP": (72, 57, 38, 27, 18),
    "elastic DP": (88, 80, 69, 58, 40),
    "M=2": (94, 88, 80, 70, 54),
    "M=4": (96, 93, 89, 82, 73),
    "M=8": (98, 96, 94, 88, 80),
    "M=16": (99, 98, 96, 93, 86),
}
"""Goodput (%) in the Decoupled DiLoCo paper, per row and chip count."""


@attrs.frozen(kw_only=True)
class ChaosModel:
    """The failure model and its calibration constants (seconds)."""

    chip_mtbi_s: float = YEAR_S
    checkpoint_s: float = 0.25
    dp_restart_s: float = 64.0
    elastic_reconfig_s: float = 14.5
    failures_per_cell: int = 20_000
    rounds: int = 60
    round_s: float = 600.0
    fragments: int = 1
    alignment: Alignment = Alignment.CARRY


CALIBRATED = ChaosModel()


@attrs.frozen(kw_only=True)
class Outages:
    """A group's interruptions: when each began and how long the group made no progress."""

    starts: tuple[float, ...]
    lengths: tuple[float, ...]
    overhead: float
    """Share of the remaining time spent writing checkpoints (a slowdown, not a stop)."""

    def goodput(self, horizon_s: float) -> float:
        lost = sum(
            min(length, horizon_s - start)
            for start, length in zip(self.starts, self.lengths, strict=True)
        )
        return (1.0 - lost / horizon_s) / (1.0 + self.overhead)


def group_outages(
    chips: int,
    restart_s: float,
    checkpoint_s: float,
    mtbi_s: float,
    horizon_s: float,
    rng: np.random.Generator,
) -> Outages:
    """Interruptions of a job of ``chips`` chips over ``horizon_s``, event by event.

    Work since the last checkpoint is redone after the restart, so it is counted
    in the outage; interruptions that arrive during an outage are absorbed by it.
    """
    rate = chips / mtbi_s
    interval = math.sqrt(2.0 * checkpoint_s / rate)
    starts: list[float] = []
    lengths: list[float] = []
    t = 0.0
    up_since = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= horizon_s:
            break
        lost = (t - up_since) % interval
        starts.append(t - lost)
        lengths.append(lost + restart_s)
        t += restart_s
        up_since = t
    return Outages(starts=tuple(starts), lengths=tuple(lengths), overhead=checkpoint_s / interval)


@attrs.frozen(kw_only=True)
class Cell:
    """One cell: goodput as the paper counts it (chip time on surviving work), and, for
    learner rows, the share the protocol committed (it also drops late deltas)."""

    row: str
    chips: int
    goodput: float
    paper: float
    committed: float | None = None

    @property
    def error(self) -> float:
        """Points between our goodput and the paper's (positive: ours is higher)."""
        return 100.0 * self.goodput - self.paper


@attrs.frozen(kw_only=True)
class Table:
    model: ChaosModel
    cells: tuple[Cell, ...]

    def rows(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.row for c in self.cells))

    def cell(self, row: str, chips: int) -> Cell:
        return next(c for c in self.cells if (c.row, c.chips) == (row, chips))

    @property
    def worst_error(self) -> float:
        return max(abs(c.error) for c in self.cells)


def dp_goodput(chips: int, elastic: bool, model: ChaosModel, rng: np.random.Generator) -> float:
    """Goodput of one DP (or elastic DP) job of ``chips`` chips, by Monte Carlo."""
    restart = model.elastic_reconfig_s if elastic else model.dp_restart_s
    horizon = model.failures_per_cell * model.chip_mtbi_s / chips
    outages = group_outages(chips, restart, model.checkpoint_s, model.chip_mtbi_s, horizon, rng)
    return outages.goodput(horizon)


STEPS_PER_ROUND = 30


def learner_scenario(
    learners: int, chips: int, model: ChaosModel, rng: np.random.Generator, seed: int = 0
) -> Scenario:
    """``learners`` elastic groups of ``chips/learners`` chips, paused by their own outages."""
    horizon = model.rounds * model.round_s
    faults: list[Fault] = []
    for name in learner_names(learners):
        o = group_outages(
            chips // learners,
            model.elastic_reconfig_s,
            model.checkpoint_s,
            model.chip_mtbi_s,
            horizon,
            rng,
        )
        faults.extend(
            Fault(kind=FaultKind.PAUSE, node=name, at_s=s, duration_s=d)
            for s, d in zip(o.starts, o.lengths, strict=True)
        )
        faults.append(
            Fault(
                kind=FaultKind.SLOW, node=name, at_s=0.0, duration_s=horizon, factor=1 + o.overhead
            )
        )
    step_s = model.round_s * model.fragments / STEPS_PER_ROUND
    return Scenario(
        name=f"chaos M={learners} chips={chips}",
        seed=seed,
        learners=learners,
        closers=1,
        colocate=False,
        duration_s=horizon,
        config=AlgorithmConfig(
            sync_every=STEPS_PER_ROUND,
            fragments=model.fragments,
            quorum=1,
            in_flight=2,
            alignment=model.alignment,
            lease_timeout_s=3 * model.round_s,
            takeover_floor_s=4 * model.round_s,
        ),
        poll_s=model.round_s / 5,
        renew_s=model.round_s,
        speed=SpeedProfile(step_s=step_s),
        faults=tuple(faults),
        check=CheckPolicy.END,
        sample_s=model.round_s,
    )


def learner_goodput(
    learners: int, chips: int, model: ChaosModel, rng: np.random.Generator
) -> tuple[float, float]:
    """Decoupled DiLoCo with ``learners`` learners, the real machines under chaos:
    (share of chip time on surviving work, share the protocol committed)."""
    report = world.run(learner_scenario(learners, chips, model, rng))
    if not report.ok:
        raise AssertionError(f"invariant broken under chaos: {report.violations[0]}")
    return report.summary.trained_share, report.summary.settled_goodput


ROWS = ("DP", "elastic DP", *(f"M={m}" for m in LEARNER_ROWS))


def cell(row: str, chips: int, model: ChaosModel = CALIBRATED, seed: int = 0) -> Cell:
    """One cell of the table, from its own generator (so cells can run in any order)."""
    rng = np.random.default_rng([seed, ROWS.index(row), chips])
    paper = PAPER[row][CHIPS.index(chips)]
    if row in ("DP", "elastic DP"):
        goodput = dp_goodput(chips, row == "elastic DP", model, rng)
        return Cell(row=row, chips=chips, goodput=goodput, paper=paper)
    trained, committed = learner_goodput(int(row.removeprefix("M=")), chips, model, rng)
    return Cell(row=row, chips=chips, goodput=trained, paper=paper, committed=committed)


def cells() -> tuple[tuple[str, int], ...]:
    """Every (row, chips) of the table, in reading order."""
    return tuple((row, chips) for row in ROWS for chips in CHIPS)


def table(
    model: ChaosModel = CALIBRATED,
    seed: int = 0,
    on_cell: Callable[[Cell], None] | None = None,
) -> Table:
    """The whole table: DP and elastic DP by Monte Carlo, the learner rows by simulation."""
    out = []
    for row, chips in cells():
        result = cell(row, chips, model, seed)
        out.append(result)
        if on_cell is not None:
            on_cell(result)
    return Table(model=model, cells=tuple(out))
