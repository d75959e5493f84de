"""``follow`` in real sessions over a local folder (``file://``): three nodes on threads, one
of them slow; with ``follow=1`` and a grace window far longer than the run, the slow learner
publishes the rounds the others are in at its next step, with the steps it has, instead of
holding every round open until its own schedule reaches it.

``n0`` creates the run (so leads it) and the slow ``n2`` is learner-only. (A slow learner on
the leader's own node is followed into the rounds too since the leader counts its own
learner live until it has looked at its lease: ``tests/core/test_follow.py``.)

The model cluster shows the same with a controlled schedule (``tests/core/test_follow.py``,
where the invariants 16 and 17 of spec/invariants.md are checked at every step); this is the
real stack: the leader's marker written through the file store, the slow learner's GET of
it, its ``Following`` event, and the records the slow learner takes part in early.

Leaving, not idling. Until 2026-12 ``n2`` stopped training after its steps and waited for
the others with its session open; in about 1 run in 20 under load the fast learners then
raised StalledError ("waiting for round 28, newest aligned round 25"). A marker makes a
learner publish at its *next* step (spec/protocol.md §7.5), and when the marker of round 26
reached ``n2`` after its last step there was none: round 26 had its quorum and a live
learner unreported, so it stayed open for the whole fixed grace window, 60 s, past the fast
learners' 30 s stall timeout, while ``n2`` waited for them at the barrier. The protocol did
what it says (``tests/core/test_follow_idle.py``); the test's schedule was the fault. Now
``n2`` stops at that worst moment every time (it waits until the fast learners are stalled
on a round it is awaited in; with the old ending that schedule raised StalledError) and leaves
as a finished learner does: its close publishes what it holds (the flush) and releases its
lease, and the round closes at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from runtime_bucket import open_tape, read_bucket
from runtime_worker import IN, TEACHER, torch_model
from test_session import FAST, algorithm

from gm_shell import Session, events
from gm_shell.stores import MailboxOptions

SLOW_STEPS = 40
SLOW_STEP_S = 0.2
"""The slow learner's pause per step; the fast ones train as fast as they can (their pace
is the commits', in_flight 2 ahead), until the slow one is done. 8 s at least: the leader
lists the leases once per lease timeout (3 s), and a learner that joined after its first
look is waited for (and so followed) only once it is known."""
FAST_MOST = 2_000
"""A bound on the fast learners' steps, should the slow one never finish."""


def test_a_slow_learner_with_follow_publishes_the_others_rounds_early(tmp_path: Path) -> None:
    url = (tmp_path / "run").as_uri()
    algo = algorithm(quorum=1, in_flight=2, grace_seconds=60.0, follow=1)
    gap = algo.sync_every // algo.fragments
    slow_done = threading.Event()
    everyone = threading.Barrier(3)
    results: list[dict[str, Any]] = [{} for _ in range(3)]

    created = threading.Event()
    progress = [0, 0, 0]  # steps each node has taken, read by n2 (see wait_for_a_stall)

    def node(i: int) -> None:
        model, train_step = torch_model(seed=i)
        got: list[events.Event] = []
        if i:
            created.wait(timeout=60)
        session = Session(
            model,
            algorithm=algo,
            mailbox=url,
            node=f"n{i}",
            role="learner" if i == 2 else "both",
            options=FAST,
            callbacks=[got.append],
        )
        rng = np.random.default_rng(i)
        steps, stalled = 0, False
        with session:
            created.set()
            while steps < (SLOW_STEPS if i == 2 else FAST_MOST):
                if i != 2 and slow_done.is_set():
                    break
                x = rng.normal(size=(32, IN)).astype(np.float32)
                train_step(x, x @ TEACHER)
                if i == 2:
                    time.sleep(SLOW_STEP_S)
                session.step(samples=32)
                steps += 1
                progress[i] = steps
            if i == 2:
                stalled = wait_for_a_stall(progress)
                slow_done.set()
            else:
                everyone.wait(timeout=120)  # the closers serve until n2 has left
        if i == 2:
            everyone.wait(timeout=120)  # left: its close published what the others await
        results[i] = {
            "events": got,
            "steps": steps,
            "stalled": stalled,
            "checkpoint": session.checkpoint,
        }

    threads = [threading.Thread(target=node, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert all(results), "a node failed (see the thread's traceback above)"
    assert results[2]["stalled"], "the fast learners never waited for the idle slow one"

    following = [e for e in results[2]["events"] if isinstance(e, events.Following)]
    assert len(following) >= 2, results[2]["events"]
    assert all(e.accepted >= 1 for e in following)
    # Nobody is ahead of the fast learners for them to follow, once both are in: n1 starts
    # after n0 created the run, so in the first cycle n0 may be ahead of it (n1 followed
    # round 0 in 3 of 6 runs since the learner and closer of n0 share their writes, c367e9a).
    assert not [
        e
        for r in results[:2]
        for e in r["events"]
        if isinstance(e, events.Following) and e.round >= algo.fragments
    ]
    # The slow learner never asks for a payload the sweep deleted (tests/core/test_slow_aligner.py).
    assert not [
        e for e in results[2]["events"] if isinstance(e, events.AlignFailed | events.CommitUnusable)
    ], results[2]["events"]
    records = {r.round: r for r in open_tape(read_bucket(url, MailboxOptions()))}
    # Rounds the slow learner followed into: it took part with fewer steps than the gap
    # between two of its rounds (published early), next to a fast learner.
    early = [
        (round_, p.steps)
        for round_ in {e.round for e in following}
        if round_ in records
        for p in records[round_].participants
        if p.learner == "n2" and p.steps < gap
    ]
    seen = {r: [(p.learner, p.steps) for p in rec.participants] for r, rec in records.items()}
    assert len(early) >= 2, ([(e.round, e.accepted) for e in following], seen)
    for round_, _ in early:
        assert {"n0", "n1"} & {p.learner for p in records[round_].participants}
    assert all(r["checkpoint"] is not None for r in results)


def wait_for_a_stall(progress: list[int], quiet_s: float = 1.0, most_s: float = 20.0) -> bool:
    """Until the fast learners have taken no step for ``quiet_s`` (they are stalled, waiting
    for a round the idle slow learner is awaited in); False if not within ``most_s``."""
    until = time.monotonic() + most_s
    while time.monotonic() < until:
        before = progress[:2]
        time.sleep(quiet_s)
        if progress[:2] == before:
            return True
    return False
