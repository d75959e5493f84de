"""When a node saves its resume state (gm_core.resume): at most once per ``every`` rounds
of commits, and never later than the first commit boundary that completes them; and what
local progress a restart keeps: never a step counted twice (against simulated runs)."""

from __future__ import annotations

import itertools
import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L, random_step
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gm_core import cluster as cl
from gm_core import keys, learner, resume
from gm_core.records import AlgorithmConfig, Alignment

# Rounds a node folds in, boundary by boundary: nondecreasing (a boundary may bring no
# new commit), with jumps (a node that was behind aligns several rounds at once).
jumps = st.lists(st.integers(0, 9), min_size=1, max_size=60)


def saves(start: int, steps: list[int], every: int) -> list[int]:
    """The rounds at which a node that joined at ``start`` saves, driven like the session."""
    saved, aligned, out = start, start, []
    for jump in steps:
        aligned += jump
        if resume.due(aligned, saved, every):
            saved = aligned
            out.append(aligned)
    return out


@given(st.integers(-1, 50), jumps, st.integers(1, 8))
def test_saves_are_at_least_every_rounds_apart(start: int, steps: list[int], every: int) -> None:
    rounds = [start, *saves(start, steps, every)]
    assert all(b - a >= every for a, b in itertools.pairwise(rounds))


@given(st.integers(-1, 50), jumps, st.integers(1, 8))
def test_no_boundary_is_left_behind_by_a_whole_interval(
    start: int, steps: list[int], every: int
) -> None:
    # After every boundary, the newest save is less than ``every`` rounds behind.
    saved, aligned = start, start
    for jump in steps:
        aligned += jump
        if resume.due(aligned, saved, every):
            saved = aligned
        assert aligned - saved < every


def test_one_save_per_sync_cycle_by_default() -> None:
    every = resume.every_rounds(None, fragments=4)
    assert every == 4
    assert saves(-1, [1] * 12, every) == [3, 7, 11]
    assert resume.every_rounds(1, fragments=4) == 1


@pytest.mark.parametrize("bad", [0, -3])
def test_an_interval_below_one_round_is_misuse(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        resume.every_rounds(bad, fragments=2)


# -- local progress across a restart ----------------------------------------------------------

CARRY = Alignment.CARRY
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L})}


def run_for(c: cl.Cluster, rng: random.Random, moves: int) -> cl.Cluster:
    for _ in range(moves):
        c = random_step(c, rng, sorted(ROLES))
    return c


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.integers(0, 2**32 - 1), st.integers(150, 900), st.integers(0, 400))
def test_restored_progress_never_counts_a_step_twice(seed: int, before: int, after: int) -> None:
    """A node saves its progress (carry), goes on, crashes; whatever the commits merged of
    it, plus what it would still merge, plus the progress a restart keeps, never exceeds
    the steps it had trained at the save: nothing is counted twice. Crashing right at the
    save, a restart keeps every fragment with progress."""
    rng = random.Random(seed)
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2, alignment=CARRY)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    c = run_for(c, rng, before)
    at_save = c.nodes["n0"].learner
    assume(at_save is not None and at_save.phase is learner.Phase.RUNNING)
    assume(at_save.aligned_round >= 0)
    copies = frozenset(r for r, o in at_save.outgoing.items() if o.snapshot is not None)
    saved = resume.drifts(at_save, copies)
    c = run_for(c, rng, after)
    last = c.nodes["n0"].learner
    assert last is not None
    c = cl.crash(c, "n0")

    tape = {record.round: record for record in cl.records(c)}
    newest = max(tape, default=-1)
    ahead = range(newest + 1, newest + config.in_flight + 1)
    waiting = {r: last.outgoing[r] for r in ahead if c.store.get(keys.snapshot(r, "n0"))}
    kept = resume.keep(
        saved,
        alignment=config.alignment,
        saved_round=at_save.aligned_round,
        node="n0",
        records={r: x for r, x in tape.items() if r > at_save.aligned_round},
        waiting={r: out.fragment for r, out in waiting.items()},
        versions=[fs.version for fs in tape[newest].frontier] if tape else [0, 0],
    )
    for fragment, drift in enumerate(saved):
        merged = sum(
            p.steps
            for x in tape.values()
            if x.fragment == fragment
            for p in x.participants
            if p.learner == "n0"
        )
        pending = [out.steps for out in waiting.values() if out.fragment == fragment]
        if kept[fragment]:
            assert merged + sum(pending) + drift.steps <= at_save.step, (fragment, drift)
        elif after == 0:
            assert drift.steps == 0, (fragment, drift)


def test_a_restart_counts_exactly_the_saved_progress_as_untrained() -> None:
    """Laid back on a fresh learner (anchors at its step), kept fragments report the saved
    steps and tokens as trained since their anchors; the others nothing; versions stay."""
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2, alignment=CARRY)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    fresh = learner.initial("n0", c.manifest, c.schema_digest, FAST_L)
    fresh = attrs.evolve(
        fresh,
        step=0,
        anchors=(learner.Anchor(version=4, step=0, tokens=0),) * 2,
        aligned_round=9,
    )
    saved = (
        resume.Drift(version=3, base_round=-1, steps=7, tokens=70),
        resume.Drift(version=4, base_round=12, steps=2, tokens=20),
    )
    back = resume.resumed(fresh, saved, (True, False))
    again = resume.drifts(back, frozenset())
    assert [(d.version, d.steps, d.tokens) for d in again] == [(4, 7, 70), (4, 0, 0)]


@pytest.mark.parametrize("published", [False, True], ids=["captured", "published"])
def test_a_snapshot_not_yet_published_is_no_base_for_the_saved_progress(published: bool) -> None:
    """Carry measures a fragment's saved progress from the copy of its newest snapshot in
    flight only once that snapshot is in the bucket: saved between its capture and its
    upload (and killed there), the progress from the anchor is saved, all of it, not the
    few steps since a capture whose delta may never be published (a runtime test lost 32
    steps of a fragment that way, 1 run in 4 under load)."""
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2, alignment=CARRY)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    state = learner.initial("n0", c.manifest, c.schema_digest, FAST_L)
    snapshot = learner.Outgoing(
        round=2, fragment=0, base_version=1, step=48, tokens=480, steps=32, token_count=320,
        final=False, published=published,
    )  # fmt: skip
    state = attrs.evolve(
        state,
        step=50,
        tokens=500,
        anchors=(learner.Anchor(version=1, step=16, tokens=160),) * 2,
        aligned_round=1,
        outgoing={2: snapshot},
    )
    first = resume.drifts(state, frozenset({2}))[0]
    if published:
        assert (first.base_round, first.steps, first.tokens) == (2, 2, 20)
    else:
        assert (first.base_round, first.steps, first.tokens) == (-1, 34, 340)


def test_what_a_restart_keeps_by_alignment_and_evidence() -> None:
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2, alignment=CARRY)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    rng = random.Random(7)
    while len(cl.records(c)) < 6:
        c = run_for(c, rng, 50)
    tape = {x.round: x for x in cl.records(c)}
    ours = [r for r, x in tape.items() if "n0" in {p.learner for p in x.participants}]
    assert ours, "n0 merged in none of the first rounds"
    r = ours[-1]
    fragment = tape[r].fragment
    drift = resume.Drift(version=1, base_round=-1, steps=5, tokens=5)
    args = {"node": "n0", "versions": [1, 1], "waiting": {}}

    def kept(alignment: Alignment, saved_round: int, **over: object) -> tuple[bool, ...]:
        records = {k: x for k, x in tape.items() if k > saved_round}
        return resume.keep(
            [drift, drift],
            **{
                "alignment": alignment,
                "saved_round": saved_round,
                "records": records,
                **args,
                **over,
            },
        )  # type: ignore[arg-type]

    # carry: a snapshot of ours merged after the save drops that fragment only
    assert kept(Alignment.CARRY, r)[fragment]
    assert not kept(Alignment.CARRY, r - 1)[fragment]
    assert kept(Alignment.CARRY, r - 1)[1 - fragment] or any(
        tape[k].fragment != fragment and k > r - 1 for k in ours
    )
    # ...or one still waiting in an open round; another learner's commits never do
    assert not kept(Alignment.CARRY, r, waiting={r + 5: fragment})[fragment]
    others = {k: x for k, x in tape.items() if "n0" not in {p.learner for p in x.participants}}
    assert all(
        resume.keep(
            [drift, drift], alignment=Alignment.CARRY, saved_round=-1, records=others, **args
        )
    )  # type: ignore[arg-type]
    # overwrite/blend: only while no commit of the fragment changed its version
    assert kept(Alignment.OVERWRITE, r, versions=[1, 1]) == (True, True)
    assert kept(Alignment.BLEND, r, versions=[2, 1]) == (False, True)
    # nothing trained since the base, or away longer than the records read: nothing back
    empty = resume.Drift(version=1, base_round=-1, steps=0, tokens=0)
    assert resume.keep(
        [empty],
        alignment=Alignment.CARRY,
        saved_round=r,
        node="n0",
        records={},
        waiting={},
        versions=[1],
    ) == (False,)
    many = {k: tape[min(tape)] for k in range(resume.MAX_RECORDS + 1)}
    assert resume.keep(
        [drift],
        alignment=Alignment.CARRY,
        saved_round=-1,
        node="n9",
        records=many,
        waiting={},
        versions=[1],
    ) == (False,)
