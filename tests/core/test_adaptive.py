"""Adaptive alignment (issue 13 item 6): per fragment, carry while the learners' deltas
agree, overwrite while they do not, with hysteresis between two thresholds.

The rule is a pure function (:func:`gm_core.adaptive.next_mode`), property-tested against a
restatement; the learner machine applies it to the cosine each commit records, fragment by
fragment, and folds each commit in by the mode it chose: driven here on the model cluster,
whose merges report the cosines the test plans (``cluster.set_cosine``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
from fast_cluster import FAST_C, FAST_L, C, L
from hypothesis import given
from hypothesis import strategies as st

from gm_core import adaptive
from gm_core import cluster as cl
from gm_core.commands import Align
from gm_core.records import AlgorithmConfig, Alignment, RoundRecord

MODES = st.sampled_from([Alignment.CARRY, Alignment.OVERWRITE])
COSINES = st.none() | st.floats(-1.5, 1.5)


@st.composite
def thresholds(draw: st.DrawFn) -> tuple[float, float]:
    """``(carry_above, overwrite_below)`` with ``-1 <= overwrite_below <= carry_above <= 1``."""
    a, b = draw(st.floats(-1, 1)), draw(st.floats(-1, 1))
    return max(a, b), min(a, b)


@given(MODES, COSINES, thresholds())
def test_a_cosine_moves_the_mode_only_across_a_threshold(
    previous: Alignment, cosine: float | None, bounds: tuple[float, float]
) -> None:
    above, below = bounds
    got = adaptive.next_mode(previous, cosine, above, below)
    if cosine is None or below <= cosine < above:
        assert got is previous
    elif cosine < below:
        assert got is Alignment.OVERWRITE
    else:
        assert got is Alignment.CARRY


@given(st.lists(COSINES, max_size=30), thresholds())
def test_the_mode_is_set_by_the_last_cosine_outside_the_band(
    cosines: list[float | None], bounds: tuple[float, float]
) -> None:
    """Hysteresis, restated: after any sequence of commits, a fragment does what the last
    cosine outside ``[overwrite_below, carry_above)`` said; with none, it still carries."""
    above, below = bounds
    mode = adaptive.INITIAL
    for cosine in cosines:
        mode = adaptive.next_mode(mode, cosine, above, below)
    decisive = [c for c in cosines if c is not None and not below <= c < above]
    expected = adaptive.INITIAL
    if decisive:
        expected = Alignment.OVERWRITE if decisive[-1] < below else Alignment.CARRY
    assert mode is expected


@given(MODES, st.floats(-1, 1), st.floats(-1, 1), thresholds())
def test_more_agreement_never_overwrites_where_less_carries(
    previous: Alignment, x: float, y: float, bounds: tuple[float, float]
) -> None:
    low, high = sorted((x, y))
    above, below = bounds
    if adaptive.next_mode(previous, low, above, below) is Alignment.CARRY:
        assert adaptive.next_mode(previous, high, above, below) is Alignment.CARRY


# --- the learner machine on the model cluster --------------------------------------------------

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L})}
CONFIG = AlgorithmConfig(
    sync_every=4, fragments=2, quorum=2, in_flight=3, alignment=Alignment.ADAPTIVE
)
"""``in_flight = P + 1``: overwriting while commits lag a round would make zero-step rounds
(no cosine; gm_core.advice says so)."""
PLAN = (0.9, 0.1, 0.5, 0.5, 0.2, 0.7, 0.45, 0.3, 0.65, 0.55)
"""Round r's cosine (fragment r mod 2): fragment 1 overwrites from round 1 and carries again
from round 5; fragment 0 carries until round 4, then overwrites; in-band values keep modes."""


def run(
    config: AlgorithmConfig, plan: Sequence[float], ticks: int = 60
) -> tuple[cl.Cluster, list[tuple[str, Align]]]:
    """Two learners at quorum 2 (every round merges both, so each has a cosine); the Align
    commands that fold commits in (not the join's loads, of round -1), by learner, each
    checked to move its fragment's anchor as its mode says."""
    rng = random.Random(5)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for r, cosine in enumerate(plan):
        c = cl.set_cosine(c, r, cosine)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    aligns: list[tuple[str, Align]] = []
    for _ in range(ticks):
        while c.inflight:
            i = rng.randrange(len(c.inflight))
            flight = c.inflight[i]
            cmd = flight.command
            if not (isinstance(cmd, Align) and cmd.round >= 0):
                c = cl.deliver(c, i)
                continue
            before = c.nodes[flight.node]
            c = cl.deliver(c, i)
            after = c.nodes[flight.node].learner
            assert before.learner is not None
            assert after is not None
            assert after.anchors[cmd.fragment].step == anchor_step(before, cmd), cmd
            aligns.append((flight.node, cmd))
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(ROLES):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
    assert cl.check(c) == []
    return c, aligns


def anchor_step(node: cl.Node, cmd: Align) -> int:
    """Where the fragment's steps count from once ``cmd`` is folded in (spec/protocol.md
    §7.6): overwrite restarts at the step it happens at; carry at this learner's snapshot of
    the round if the commit merged it, else it keeps the old anchor's."""
    state = node.learner
    assert state is not None
    if cmd.mode is Alignment.OVERWRITE:
        return node.step
    assert cmd.mode is Alignment.CARRY
    out = state.outgoing.get(cmd.round)
    return out.step if cmd.from_snapshot and out is not None else state.anchors[cmd.fragment].step


def expected_modes(records: Sequence[RoundRecord], config: AlgorithmConfig) -> dict[int, Alignment]:
    """The mode each committed round is folded in by, replaying the rule over the tape."""
    modes = [adaptive.INITIAL] * config.fragments
    out = {}
    for record in records:
        f = record.fragment
        modes[f] = adaptive.next_mode(
            modes[f], record.cosine, config.carry_above, config.overwrite_below
        )
        out[record.round] = modes[f]
    return out


def test_each_commit_is_folded_in_by_its_fragments_mode() -> None:
    c, aligns = run(CONFIG, PLAN)
    records = cl.records(c)
    assert len(records) > len(PLAN)  # rounds past the plan have no cosine: modes hold
    assert [r.cosine for r in records[: len(PLAN)]] == list(PLAN)
    expected = expected_modes(records, CONFIG)
    assert {name for name, _ in aligns} == {"n0", "n1"}
    assert {a.mode for _, a in aligns} == {Alignment.CARRY, Alignment.OVERWRITE}
    for name, a in aligns:
        assert a.mode is expected[a.round], (name, a.round)
    changes = [(n, x.round, x.detail) for n, x in c.notes if x.kind == "alignment_changed"]
    for name in ("n0", "n1"):
        assert [(r, d) for n, r, d in changes if n == name] == [
            (1, "fragment=1 overwrite cosine 0.100"),
            (4, "fragment=0 overwrite cosine 0.200"),
            (5, "fragment=1 carry cosine 0.700"),
            (7, "fragment=1 overwrite cosine 0.300"),
            (8, "fragment=0 carry cosine 0.650"),
        ]


def test_a_fixed_rule_ignores_the_cosine() -> None:
    """The contrast: under ``carry`` the same cosines change nothing."""
    c, aligns = run(attrs.evolve(CONFIG, alignment=Alignment.CARRY), PLAN)
    assert aligns
    assert {a.mode for _, a in aligns} == {Alignment.CARRY}
    assert not [n for n in c.notes if n[1].kind == "alignment_changed"]
