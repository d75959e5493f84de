"""A joining learner reads each commit once, while its walk still checks the tip.

Joining reads the head (with the manifest), the record it names, the round after it, and
the record before it (the tip's check, protocol.md §16.5.2). The learner machine asks for
the tip's commits as soon as it holds the record (``Fetch``), and the load that follows
the check takes them from what was read: a real ``Session`` over a store that takes 50 ms
a request, with every request journaled (``bench.latency``), on a real tape.
"""

from __future__ import annotations

from bench.gm_runs import Bucket, build_tape, join_requests
from bench.reference.journal import waves

from gm_shell import DiLoCo

ROUNDS = 12
LATENCY_MS = 50.0


def test_a_joiner_reads_each_commit_once_and_while_it_checks_the_tip() -> None:
    algorithm = DiLoCo(sync_every=120, fragments=4)
    bucket = Bucket(algorithm, 8, 256)
    try:
        build_tape(bucket, ROUNDS)
        mine, _ = join_requests(bucket, "joiner", LATENCY_MS)
    finally:
        bucket.close()
    payloads = [r for r in mine if r.category == "payloads" and r.cls == "GET"]
    records = [r for r in mine if r.category == "rounds" and r.cls == "GET"]
    assert len(payloads) == algorithm.fragments  # each commit read once: fetched, then loaded
    assert len({r.key for r in payloads}) == len(payloads)
    tip, check = records[0], records[-1]  # the record the head names; the one before it
    assert check.key < tip.key
    assert max(r.started for r in payloads) < check.started  # read while the walk checked
    # Head with the manifest; the tip; the probe past it (and the commits); the check (which
    # the commits' reads may still overlap: then it counts in their wave).
    assert waves(mine) <= 4
