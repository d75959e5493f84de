"""A poisoned learner among honest ones: its deltas are rejected as ``outlier``, the run goes on.

Four nodes train over a ``file://`` bucket with a median merge and both outlier
screens; one of them (``evil``) publishes every delta multiplied by 100 — finite,
well-formed, from a learner that holds a valid lease, so every earlier check
accepts it. Every round offered all four (or three) deltas must name ``evil`` as an
outlier, never as a participant, and the run must keep committing with the honest three.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from runtime_bucket import Witness, judge
from runtime_harness import file_run, make_harness, wait_until
from test_chaos import committed, started

from gm_core.records import Reason

HONEST = ("n0", "n1", "n2")


def test_a_scaled_up_learner_is_rejected_as_outlier_and_the_run_goes_on(tmp_path: Path) -> None:
    url, options = file_run(tmp_path)
    h = make_harness(
        url,
        options,
        tmp_path,
        quorum=4,
        lease_timeout_s=10.0,  # few lapsed leases on a loaded machine: most rounds offer 4
        merge="median",
        outlier_norm_factor=3.0,
        outlier_cosine=0.0,
    )
    witness = Witness(url, options)
    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        witness.start()
        for name in HONEST[1:]:
            h.spawn(name)
        h.spawn("evil", role="learner", delta_scale=100.0)
        wait_until("everyone to join", lambda: all(started(h, n) for n in h.nodes), 60)
        count = len(committed(witness))
        wait_until("ten more commits", lambda: len(committed(witness)) >= count + 10, 120)
        codes = h.stop("evil", *HONEST[::-1])
    finally:
        h.close()
        witness.stop()
    assert all(code == 0 for code in codes.values()), codes
    judgement = judge(url, options, witness)
    assert not judgement.violations, judgement.violations
    screened = [r for r in judgement.records if len(r.participants) + len(r.rejections) == 4]
    assert len(screened) >= 5, [(r.round, r.participants, r.rejections) for r in judgement.records]
    for record in screened:
        assert {p.learner for p in record.participants} == set(HONEST), record
        assert [(x.learner, x.reason) for x in record.rejections] == [("evil", Reason.OUTLIER)]
    for record in judgement.records:
        # A round that closed with only two deltas (a lease lapsed on a loaded machine) is
        # not screened: with two there is no majority. With three or more, evil is out.
        offered = len(record.participants) + sum(
            x.reason is Reason.OUTLIER for x in record.rejections
        )
        if offered >= 3:
            assert "evil" not in {p.learner for p in record.participants}, record
    for name in HONEST:
        result = h.result(name)
        assert all(np.all(np.isfinite(p)) for p in result["params"])
    # Not asserted: that the honest loss falls. In two CI runs it rose (mean 0.344 vs 0.248
    # over the first 20 steps, and 1.136 vs 0.433 with no round merging evil): an open
    # problem of the robust rules in this short run, reported in the issue 12 note.
