"""Hung processes (SIGSTOP, not dead): a learner is waited for at most the lease timeout,
and a closer is taken over; both come back (SIGCONT) and rejoin the run.

Three real processes: n0 and n1 learner-and-closer, n2 a learner, quorum 3 (every
learner), so a round waits for a silent learner until its lease goes stale. Commit
times are what a witness of the bucket saw, on the test's clock.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from runtime_bucket import Witness, judge
from runtime_harness import file_run, make_harness, wait_until
from test_chaos import committed, newest_leader, started

from gm_core import codec, keys
from gm_core.records import RoundRecord

LEASE_TIMEOUT_S = 2.0
SLACK_S = 2.5
"""Lease renewal period, polls, and a loaded 2-core machine, on top of the timeout."""


def commit_times(witness: Witness, since: float) -> list[float]:
    times = sorted(witness.first_seen(keys.round_record(r)) for r in committed(witness))
    return [t for t in times if t >= since]


def first_commit_by(witness: Witness, closer: str, since: float) -> float:
    """When the witness first saw a record committed by ``closer`` after ``since``."""
    times = []
    for r in committed(witness):
        data, seen = witness.seen[keys.round_record(r)]
        if seen >= since and codec.decode(RoundRecord, data).closer == closer:
            times.append(seen)
    return min(times)


def test_hung_learner_is_waited_for_at_most_the_lease_timeout_and_hung_closer_is_taken_over(
    tmp_path: Path,
) -> None:
    url, options = file_run(tmp_path)
    h = make_harness(url, options, tmp_path, quorum=3, lease_timeout_s=LEASE_TIMEOUT_S)
    witness = Witness(url, options)
    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        witness.start()
        h.spawn("n1")
        h.spawn("n2", role="learner")
        wait_until("everyone to join", lambda: started(h, "n1") and started(h, "n2"), 60)
        count = len(committed(witness))
        wait_until("rounds with all three", lambda: len(committed(witness)) >= count + 4, 60)

        # A learner hangs: rounds go on without it, each waiting at most the lease timeout.
        hung_at = time.time()
        h.signal("n2", signal.SIGSTOP)
        time.sleep(4 * LEASE_TIMEOUT_S)
        during = commit_times(witness, hung_at)
        h.signal("n2", signal.SIGCONT)
        gaps = [b - a for a, b in zip([hung_at, *during], during, strict=False)]
        assert len(during) >= 4, during
        assert max(gaps) <= LEASE_TIMEOUT_S + SLACK_S, gaps

        # The leader hangs: a follower claims the round once its lease is stale.
        leader = newest_leader(witness)
        assert leader in ("n0", "n1")
        follower = "n1" if leader == "n0" else "n0"
        stopped_at = time.time()
        h.signal(leader, signal.SIGSTOP)
        wait_until("a takeover", lambda: newest_leader(witness) == follower, 30)
        took_s = first_commit_by(witness, follower, stopped_at) - stopped_at
        count = len(committed(witness))
        wait_until("rounds under the new leader", lambda: len(committed(witness)) >= count + 3, 30)
        h.signal(leader, signal.SIGCONT)
        count = len(committed(witness))
        wait_until("rounds after both resumed", lambda: len(committed(witness)) >= count + 6, 60)
        # Rounds closed while nodes stop one by one have fewer participants by design.
        before_stop = len(committed(witness))
        codes = h.stop("n2", follower, leader)
    finally:
        h.close()
        witness.stop()
    assert all(code == 0 for code in codes.values()), codes
    print(f"hung learner: commit gaps {[round(g, 2) for g in gaps]} s")
    print(f"hung closer: taken over {took_s:.2f} s after SIGSTOP")
    assert took_s <= LEASE_TIMEOUT_S + 2 * SLACK_S, took_s
    judgement = judge(url, options, witness, written=h.written())
    assert not judgement.violations, judgement.violations
    later = [r for r in judgement.records if r.round < before_stop][-3:]
    assert all(len(r.participants) >= 2 for r in later), later
    resumed = {e["node"] for e in h.all_events() if e["event"] == "superseded"}
    events = {(e["node"], e["event"]) for e in h.all_events()}
    assert (follower, "took_over") in events
    assert leader in resumed or any(r.closer == leader for r in judgement.records[-3:])
    assert any("n2" in {p.learner for p in r.participants} for r in later)
