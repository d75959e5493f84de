"""A committed payload overwritten or deleted in a live run (issue 12 item 6, spec/protocol.md
§16.10).

Nodes train in their own processes, on a local folder (the payload overwritten) and on
SeaweedFS (deleted). Once a few rounds have committed, this test overwrites the newest
commit's parameters payload with garbage, or deletes it, as a bad restore, a lifecycle
rule or an attacker with write access would. Before §16.10 joining
learners re-joined in a loop and the closer retried its merge forever
(``merge_failed``); now each node names the object (``commit_unusable``), loads the
commit before it, the closer merges the next round of that fragment into that
commit, and the run goes on, finite.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from runtime_harness import Harness, file_run, make_harness, s3_run, wait_until
from test_chaos import started
from test_hostile_bucket import assert_honest_and_small

from gm_core import codec, keys
from gm_core.records import RoundRecord
from gm_shell.mailbox import Mailbox
from gm_shell.stores import MailboxOptions


async def read_tape(url: str, options: MailboxOptions) -> list[RoundRecord]:
    """The records of the (open) run, from round 0 to the first absent one."""
    records: list[RoundRecord] = []
    with Mailbox.open(url, options=options) as mailbox:
        while (got := await mailbox.get(keys.round_record(len(records)))) is not None:
            records.append(codec.decode(RoundRecord, got.data))
    return records


async def spoil(url: str, options: MailboxOptions, key: str, how: str) -> None:
    with Mailbox.open(url, options=options) as mailbox:
        if how == "deleted":
            await mailbox.delete([key])
        else:
            await mailbox.put(key, b"these are not the committed parameters")


S3_MARKS = (pytest.mark.servers, pytest.mark.xdist_group("runtime-s3"))


def commits(url: str, options: MailboxOptions) -> list[RoundRecord]:
    return [r for r in asyncio.run(read_tape(url, options)) if r.participants]


def events(h: Harness, name: str, kind: str) -> list[dict[str, str]]:
    return [e for e in h.events(name) if e["event"] == kind]


@pytest.mark.parametrize(
    ("store", "how"),
    [("file", "overwritten"), pytest.param("s3", "deleted", marks=S3_MARKS)],
)
def test_an_overwritten_or_deleted_commit_is_named_and_the_run_heals_past_it(
    store: str, how: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Nodes cache the commits they write or read, so the damage is met by nodes that
    start after it: the run is stopped, the newest commit overwritten or deleted, and two
    fresh nodes (one closer-capable, started once the other has met the damage) carry the
    run on from the bucket alone."""
    if store == "file":
        url, options = file_run(tmp_path)
    else:
        url, options = s3_run(request.getfixturevalue("seaweedfs"))
    h = make_harness(url, options, tmp_path, quorum=2)
    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        h.spawn("n1", seed=1, role="learner")
        wait_until("three commits", lambda: len(commits(url, options)) >= 3, 90)
        assert h.stop("n1", "n0") == {"n1": 0, "n0": 0}
        tape = asyncio.run(read_tape(url, options))
        bad = commits(url, options)[-1]
        unusable = tape[-1].frontier[bad.fragment]
        asyncio.run(spoil(url, options, unusable.theta.key, how))
        # The learner first: once the closer has healed the fragment, a later join would
        # start past the damage and never meet it (seen under the full suite's load).
        h.spawn("n3", seed=3, role="learner")
        wait_until("the learner to meet it", lambda: bool(events(h, "n3", "commit_unusable")), 90)
        h.spawn("n2", seed=2)

        def healed() -> list[RoundRecord]:
            return [
                r
                for r in commits(url, options)
                if r.fragment == bad.fragment and r.version > unusable.version
            ]

        wait_until("the fragment to commit again", lambda: bool(healed()), 90)
        count = len(commits(url, options))
        wait_until("more commits", lambda: len(commits(url, options)) >= count + 4, 90)
        codes = h.stop("n3", "n2")
        results = {name: h.result(name) for name in ("n2", "n3")}
        named = {name: events(h, name, "commit_unusable") for name in ("n2", "n3")}
        failures = [
            e
            for n in ("n2", "n3")
            for k in ("commit_lost", "merge_failed")
            for e in events(h, n, k)
        ]
    finally:
        h.close()
    assert codes == {"n2": 0, "n3": 0}
    assert named["n2"], "the joining closer-learner names the object"
    assert named["n3"], "the joining learner names the object"
    assert all(unusable.theta.key in e["detail"] for n in named for e in named[n])
    assert not failures, failures
    first = healed()[0]
    assert first.version == unusable.version + 1
    assert unusable.theta.key not in {fs.theta.key for fs in first.frontier}
    assert_honest_and_small(results)  # finite, and memory bounded as under every attack
