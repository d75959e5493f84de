"""A poisoned learner among honest ones: its deltas are rejected as ``outlier``, the run goes on.

Four nodes train over a ``file://`` bucket with a median merge and both outlier
screens; one of them (``evil``) publishes every delta multiplied by 100 — finite,
well-formed, from a learner that holds a valid lease, so every earlier check
accepts it. Every round offered all four (or three) deltas must name ``evil`` as an
outlier, never as a participant, and the run must keep committing with the honest three,
each ending below the untrained model's loss.

``evil`` starts once a round has merged all three honest learners. Started earlier, it
can meet ``n0`` alone: a round of two deltas is not screened (neither is a majority), so
it merges ``100·Δ``, and the outer momentum keeps applying that step for rounds after
(a CI run lost the loss assertion that way; honest losses 3 to 200 after it here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from runtime_bucket import Witness, judge
from runtime_harness import file_run, make_harness, wait_until
from test_chaos import committed, started

from gm_core.records import Reason, RoundRecord
from gm_shell.stores import MailboxOptions

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
        wait_until(
            "a round of the three honest", lambda: merged_all(url, options, witness), 120, 1.0
        )
        h.spawn("evil", role="learner", delta_scale=100.0)
        wait_until("evil to join", lambda: started(h, "evil"), 60)
        count = len(committed(witness))
        wait_until("ten more commits", lambda: len(committed(witness)) >= count + 10, 120)
        # Rounds that offered all four: on a loaded machine a lease lapses now and then and
        # a round closes with three (a CI-like run of three at once saw 4 of 12): wait for
        # the evidence rather than for a number of commits.
        wait_until(
            "five rounds offered all four",
            lambda: len(screened(url, options, witness)) >= 5,
            180,
            1.0,
        )
        codes = h.stop("evil", *HONEST[::-1])
    finally:
        h.close()
        witness.stop()
    assert all(code == 0 for code in codes.values()), codes
    judgement = judge(url, options, witness, written=h.written())
    assert not judgement.violations, judgement.violations
    four = offered_all(judgement.records)
    assert len(four) >= 5, [(r.round, r.participants, r.rejections) for r in judgement.records]
    for record in four:
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
    # The poisoned learner never wrecked the model: every honest learner ends below the
    # untrained model's loss (n0's first steps: it created the run). Its own first steps are
    # no yardstick: n1 and n2 join a trained model, and a short run's loss is noisy (a CI
    # run saw n1 at 0.43 over its first steps and 0.49 over its last, all far below start).
    start = np.mean(h.result("n0")["first_losses"])
    for name in HONEST:
        result = h.result(name)
        assert all(np.all(np.isfinite(p)) for p in result["params"])
        last = np.mean(result["losses"])
        assert last < start, (name, start, last, result["losses"])


def offered_all(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """The records of rounds that offered all four learners' deltas (merged or rejected)."""
    return [r for r in records if len(r.participants) + len(r.rejections) == 4]


def screened(url: str, options: MailboxOptions, witness: Witness) -> list[RoundRecord]:
    """The committed rounds so far that offered all four learners' deltas."""
    return offered_all(judge(url, options, witness).records)


def merged_all(url: str, options: MailboxOptions, witness: Witness) -> bool:
    """Whether some committed round merged every honest learner."""
    records = judge(url, options, witness).records
    return any({p.learner for p in r.participants} >= set(HONEST) for r in records)
