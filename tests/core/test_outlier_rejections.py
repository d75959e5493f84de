"""A merge's outliers become ``outlier`` rejections on the tape, never participants."""

from __future__ import annotations

import attrs

from gm_core import closer, codec
from gm_core import cluster as cl
from gm_core.commands import Merge, PutOnce
from gm_core.events import Merged
from gm_core.records import AlgorithmConfig, Reason, RoundRecord

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
ROLES = {"a": frozenset({L, C}), "b": frozenset({L}), "c": frozenset({L}), "d": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=8, fragments=1, quorum=4, in_flight=1)


def until_a_merge_of_four() -> tuple[cl.Cluster, Merge]:
    """Run the pure cluster in order until the closer asks to merge four snapshots."""
    c = cl.create(CONFIG, ROLES)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    for _ in range(400):
        for index, item in enumerate(c.inflight):
            if isinstance(item.command, Merge) and len(item.command.contributions) == 4:
                return attrs.evolve(c, inflight=c.inflight[:index]), item.command
        while c.inflight:
            c = cl.deliver(c, 0)
            if any(isinstance(x.command, Merge) for x in c.inflight):
                break
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(ROLES):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
    raise AssertionError("no merge of four snapshots")


def test_outliers_of_a_merge_are_rejected_by_name() -> None:
    c, merge = until_a_merge_of_four()
    state = c.nodes["a"].closer
    assert state is not None
    theta = merge.contributions[0].payload  # any payload reference: the record only names it
    merged = Merged(
        now_s=c.now_s,
        req=merge.req,
        theta=theta,
        outer=None,
        update=None,
        cosine=0.5,
        outliers=("c", "nobody"),  # a name that was never accepted is ignored
    )
    state, cmds = closer.advance(state, merged)
    puts = [x for x in cmds if isinstance(x, PutOnce) and x.key.startswith("rounds/")]
    assert len(puts) == 1
    record = codec.decode(RoundRecord, puts[0].data)
    assert [p.learner for p in record.participants] == ["a", "b", "d"]
    assert [(r.learner, r.reason) for r in record.rejections] == [("c", Reason.OUTLIER)]
    assert record.version == merge.base.version + 1
