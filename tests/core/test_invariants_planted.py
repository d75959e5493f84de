"""Each invariant that re-states a rule catches a one-line bug planted in that rule.

The invariants in ``gm_core.invariants`` re-state the schedule, the acceptance of a
snapshot, the merge weights and the closing condition from the spec instead of
calling the code that implements them (an invariant that called the planted
function would agree with the bug). Here each bug is planted with ``monkeypatch``
in the code under test — ``schedule``, ``verdicts`` or ``closer`` — the real
machines run a fair schedule in the model cluster, and the invariant must name
the violation; the same run without the bug must break nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from gm_core import closer, codec, invariants, keys, schedule, verdicts
from gm_core import cluster as cl
from gm_core.closer import commit
from gm_core.commands import Command
from gm_core.records import AlgorithmConfig, Snapshot

sys.path.insert(0, str(Path(__file__).parent))
from test_cluster_stateful import make, run_fair  # a helper beside this file

Plant = Callable[[pytest.MonkeyPatch], None]


def broken(config: AlgorithmConfig, ticks: int = 80) -> set[str]:
    """The names of the invariants a fair run of ``config`` breaks."""
    c = run_fair(make(config), ticks, check=False)
    return {v.invariant for v in cl.check(c)}


def _step_of_from_offset(round: int, sync_every: int, fragments: int) -> int:
    cycle, offset = divmod(round, fragments)
    return cycle * sync_every + (offset * sync_every) // fragments  # bug: offset, not offset + 1


def _fragment_rotated(round: int, fragments: int) -> int:
    return (round + 1) % fragments  # bug: + 1


def _plant_step(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(schedule, "step_of", _step_of_from_offset)


def _plant_fragment(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(schedule, "fragment_of", _fragment_rotated)


def _plant_unsigned(mp: pytest.MonkeyPatch) -> None:
    real = verdicts.judge_snapshot
    # bug: the judge never looks at signatures
    mp.setattr(
        verdicts, "judge_snapshot", lambda s, **kw: real(s, **(kw | {"require_signatures": False}))
    )


def _plant_linear_weight(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(verdicts, "merge_weight", lambda tokens, steps: tokens / steps)  # bug: not squared


def _plant_unnormalized(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        verdicts, "normalized_weights", lambda ws: tuple(w / max(ws) for w in ws)
    )  # bug: no sum


def _plant_quorum_off_by_one(mp: pytest.MonkeyPatch) -> None:
    real = verdicts.ready_to_close
    mp.setattr(verdicts, "ready_to_close", lambda **kw: real(**(kw | {"quorum": kw["quorum"] - 1})))


def _plant_leases_ignored(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(commit, "_live", lambda state, now_s: frozenset())  # bug: nobody live by lease


def _plant_no_decision(mp: pytest.MonkeyPatch) -> None:
    def merge_at_once(
        state: closer.CloserState, now_s: float, cmds: list[Command]
    ) -> closer.CloserState:
        accepted = commit._accepted(state)
        return commit._merge(state, now_s, accepted, cmds) if accepted else state  # bug

    mp.setattr(commit, "_maybe_close", merge_at_once)


QUORUM_3 = AlgorithmConfig(sync_every=8, fragments=2, quorum=3, in_flight=1)
CASES: dict[str, tuple[Plant, AlgorithmConfig, str]] = {
    "step_of from the offset": (_plant_step, QUORUM_3, "schedule_coverage"),
    "fragment_of rotated": (_plant_fragment, QUORUM_3, "schedule_coverage"),
    "signatures not judged": (
        _plant_unsigned,
        attrs.evolve(QUORUM_3, require_signatures=True),
        "acceptance_soundness",
    ),
    "weight tokens/steps": (_plant_linear_weight, QUORUM_3, "acceptance_soundness"),
    "weights not summing to 1": (_plant_unnormalized, QUORUM_3, "merge_weights"),
    "quorum off by one": (_plant_quorum_off_by_one, QUORUM_3, "closing_rule"),
    "leases ignored when closing": (_plant_leases_ignored, QUORUM_3, "closing_rule"),
    "merge without a decision": (_plant_no_decision, QUORUM_3, "closing_rule"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_planted_bug_is_caught_by_the_invariant_that_restates_its_rule(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant, config, invariant = CASES[name]
    assert broken(config) == set(), "the run breaks something without the bug"
    with monkeypatch.context() as mp:
        plant(mp)
        found = broken(config)
    assert invariant in found, found


def test_a_snapshot_is_judged_against_the_round_it_was_listed_under() -> None:
    """A participant's snapshot that claims another round (same fragment, current base)
    fails acceptance: the folder it sits in is what counts, and an object naming another
    round is no snapshot of that folder's learner at all (spec/protocol.md §16.4.2)."""
    c = run_fair(make(QUORUM_3), 60)
    record = cl.records(c)[4]
    key = keys.snapshot(4, record.participants[0].learner)
    snap = codec.decode(Snapshot, dict(c.store.created)[key])
    forged = codec.encode(attrs.evolve(snap, round=6))
    created = tuple((k, forged if k == key else d) for k, d in c.store.created)
    c = attrs.evolve(c, store=attrs.evolve(c.store, created=created))
    assert invariants.acceptance_soundness(cl.view(c)) == (
        f"round 4: {record.participants[0].learner} never wrote a valid snapshot",
    )
