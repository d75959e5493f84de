"""A claim flood in an open run, on a real bucket (spec/protocol.md §16.4.4; issue 12 item 2).

Three processes on ``file://`` (n0 and n1 learner-and-closer, n2 a learner), an open run,
so format 2 with public claim names. An outsider writes, at the names a follower bids for
in each of the next rounds, a codec-valid claim naming a node that never lived at every
attempt up to ``FLOOD`` (and garbage at every seventh), as soon as the leader hangs (SIGSTOP).
The follower meets the flood, jumps past it by its own nonce, takes the round over, and
the run commits on; the bucket's invariants hold. Format 1's rule (one attempt past the
highest met, a lease look and a poll per ghost) would have spent ``FLOOD`` bids on it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from runtime_bucket import Witness, judge
from runtime_harness import file_run, make_harness, wait_until
from test_chaos import committed, newest_leader, started

from gm_core import auth, codec, election, keys
from gm_core.records import FORMAT_2, Claim, Manifest
from gm_shell.mailbox import Mailbox
from gm_shell.stores import MailboxOptions

LEASE_TIMEOUT_S = 2.0
FLOOD = 200
ROUNDS_AHEAD = 2
"""Rounds flooded past the newest record the witness saw once the leader stopped (one
more, should the witness's look have missed the leader's last record)."""


async def flood(url: str, options: MailboxOptions, first: int) -> int:
    """Write the flood at rounds ``first .. first + ROUNDS_AHEAD - 1``; the objects written."""
    async with Mailbox.open(url, options=options) as box:
        got = await box.get(keys.manifest())
        assert got is not None
        manifest = codec.decode(Manifest, got.data)
        assert manifest.format == FORMAT_2  # an open run created today
        assert manifest.auth is None
        envelope = auth.of_run(manifest, None)
        writes = []
        for round_ in range(first, first + ROUNDS_AHEAD):
            for attempt in range(1, FLOOD + 1):
                key = election.claim_key(envelope, round_, attempt)
                body = codec.encode(Claim(round=round_, attempt=attempt, node=f"ghost{attempt}"))
                writes.append(box.put_once(key, b"\x00garbage" if attempt % 7 == 0 else body))
        await asyncio.gather(*writes)
        return len(writes)


def test_a_follower_takes_a_round_over_past_a_claim_flood_in_an_open_run(tmp_path: Path) -> None:
    url, options = file_run(tmp_path)
    h = make_harness(url, options, tmp_path, quorum=2, lease_timeout_s=LEASE_TIMEOUT_S)
    witness = Witness(url, options)
    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        witness.start()
        h.spawn("n1")
        h.spawn("n2", role="learner")
        wait_until("everyone to join", lambda: started(h, "n1") and started(h, "n2"), 60)
        wait_until("a few rounds", lambda: len(committed(witness)) >= 4, 60)
        leader = newest_leader(witness)
        assert leader in ("n0", "n1")
        follower = "n1" if leader == "n0" else "n0"
        stopped_at = time.time()
        h.signal(leader, signal.SIGSTOP)
        # The flood goes where the follower will bid: past the newest record once the leader
        # is stopped (a flood written first was outrun by the run on a loaded machine: the
        # takeover came rounds later, at claim 1). The follower waits a lease timeout and
        # the takeover floor before it bids; 400 writes take well under a second.
        witness.poll()
        written = asyncio.run(flood(url, options, committed(witness)[-1] + 1))
        wait_until("a takeover", lambda: newest_leader(witness) == follower, 60)
        took_s = time.time() - stopped_at
        count = len(committed(witness))
        wait_until("rounds under the new leader", lambda: len(committed(witness)) >= count + 3, 60)
        h.signal(leader, signal.SIGCONT)
        codes = h.stop("n2", follower, leader)
    finally:
        h.close()
        witness.stop()
    assert all(code == 0 for code in codes.values()), codes
    took = [e for e in h.events(follower) if e["event"] == "took_over"]
    assert took, "no takeover event"
    claim = int(took[-1]["detail"].removeprefix("claim="))
    print(f"{written} flooded claims; taken over {took_s:.1f} s after SIGSTOP at claim {claim}")
    assert claim > election.JUMP_AFTER  # it met the flood and jumped past it
    judgement = judge(url, options, witness, written=h.written())
    assert not judgement.violations, judgement.violations
