"""kill -9 chaos on real processes: the closer and random learners die and come back.

Four nodes train the same small torch model through one bucket (a local folder,
and a SeaweedFS server): n0 and n1 are learner-and-closer, n2 and n3 learners
only. A seeded schedule kill -9s the node that leads the current round, then
random nodes, at random moments, and restarts most of them; one node joins only
mid-run. Afterwards the bucket alone is judged — every named invariant of
``gm_core.invariants`` over its contents and the create-once writes a witness
saw — and every node that closed cleanly must hold exactly the committed
frontier its session reported.

Replay a failure with the seed printed in its message (``GM_CHAOS_SEED``).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
from runtime_bucket import Judgement, Witness, judge
from runtime_harness import Harness, make_harness, wait_until

from gm_core import codec, keys
from gm_core.records import RoundRecord
from gm_core.tape import frontier_of
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.stores import MailboxOptions


def committed(witness: Witness) -> list[int]:
    """Rounds whose record the witness has seen, in order."""
    rounds = []
    for key in list(witness.seen):
        if key.startswith(keys.ROUNDS_PREFIX):
            parsed = keys.parse(key)
            assert isinstance(parsed, keys.RoundKey), key
            rounds.append(parsed.round)
    return sorted(rounds)


def newest_leader(witness: Witness) -> str | None:
    """The node the newest record names to close the next round."""
    rounds = committed(witness)
    if not rounds:
        return None
    data, _ = witness.seen[keys.round_record(rounds[-1])]
    return codec.decode(RoundRecord, data).next_closer


ROLES = {"n0": "both", "n1": "both", "n2": "learner", "n3": "learner"}


def started(h: Harness, name: str) -> bool:
    """The node's session has joined (the worker marks it once ``__enter__`` returned)."""
    return (h.nodes[name].out / "started").exists()


def killable(h: Harness) -> list[str]:
    """Any live node but the last live closer-capable one (someone must be able to close)."""
    alive = [n for n in ROLES if h.nodes[n].alive]
    closers = [n for n in alive if ROLES[n] == "both"]
    return [n for n in alive if closers != [n]]


def wait_for_rounds(witness: Witness, more: int, timeout_s: float) -> None:
    target = len(committed(witness)) + more
    wait_until(f"{more} more commits", lambda: len(committed(witness)) >= target, timeout_s)


def assert_holds_its_frontier(h: Harness, name: str, judgement: Judgement) -> int:
    """The node's parameters are, bit for bit, the commit its session reported."""
    result = h.result(name)
    by_round = {r.round: r for r in judgement.records}
    record = by_round.get(result["round"]) if result["round"] >= 0 else None
    frontier = frontier_of(judgement.manifest, record)
    fragment_codec = FragmentCodec(judgement.manifest)
    for fragment, (params, state) in enumerate(zip(result["params"], frontier, strict=True)):
        assert np.all(np.isfinite(params))
        _, ref = fragment_codec.encode(fragment, Role.THETA, 0, params)
        assert ref.digest == state.theta.digest, f"{name} fragment {fragment} differs"
    return int(result["round"])


def test_kill9_closer_and_learners_then_judge_the_bucket(
    run_url: tuple[str, MailboxOptions], tmp_path: Path
) -> None:
    seed = int(os.environ.get("GM_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    url, options = run_url
    h = make_harness(url, options, tmp_path)
    witness = Witness(url, options)
    events: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        events.append(f"{time.monotonic() - t0:.1f}s {what}")

    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        witness.start()
        for name in ("n1", "n2"):
            h.spawn(name, role=ROLES[name])
        wait_until("n1 and n2 to join", lambda: started(h, "n1") and started(h, "n2"), 60)
        note("n1, n2 joined")
        wait_for_rounds(witness, 2, 60)
        h.spawn("n3", role="learner")  # joins mid-run
        note("n3 joined")
        wait_until("n3 to join", lambda: started(h, "n3"), 60)
        for _ in range(3):
            leader = newest_leader(witness) or "n0"
            spare = "n1" if leader == "n0" else "n0"
            if not h.nodes[spare].alive:  # someone must be able to take the round over
                h.spawn(spare, role="both")
                note(f"restart {spare}")
                wait_until("the spare closer to join", lambda s=spare: started(h, s), 60)
            h.kill(leader)
            note(f"kill -9 {leader} (leader)")
            time.sleep(rng.uniform(0.2, 1.5))
            # Nobody else is killable when the spare closer is the only node left alive
            # (nodes killed earlier and left down): the kill of the leader stands alone.
            candidates = killable(h)
            victims = [rng.choice(candidates)] if candidates else []
            for victim in victims:
                h.kill(victim)
                note(f"kill -9 {victim}")
            wait_for_rounds(witness, 2, 60)  # the run goes on without them
            back = [n for n in (leader, *victims) if not h.nodes[n].alive and rng.random() < 0.8]
            for name in back:
                h.spawn(name, role=ROLES[name])
                note(f"restart {name}")
            wait_until("restarted nodes to join", lambda b=back: all(started(h, n) for n in b), 60)
            wait_for_rounds(witness, 2, 60)
        for name in ROLES:
            if not h.nodes[name].alive:
                h.spawn(name, role=ROLES[name])
                note(f"restart {name}")
        wait_until("every node to join", lambda: all(started(h, n) for n in ROLES), 60)
        wait_for_rounds(witness, 4, 90)
        note("stopping")
        codes = h.stop("n2", "n3")
        codes |= h.stop("n1")
        codes |= h.stop("n0")
        note("stopped")
    except AssertionError as error:
        raise AssertionError(f"{error}; seed={seed} events={events}") from error
    finally:
        h.close()
        witness.stop()
    context = f"seed={seed} events={events}"
    assert all(code == 0 for code in codes.values()), (codes, context)
    judgement = judge(url, options, witness, written=h.written())
    assert not judgement.violations, (judgement.violations, context)
    assert len(judgement.records) >= 20, context
    closers = {r.closer for r in judgement.records}
    assert closers == {"n0", "n1"}, (closers, context)
    rounds = [assert_holds_its_frontier(h, name, judgement) for name in ("n2", "n3", "n1", "n0")]
    assert rounds[-1] == judgement.records[-1].round, (rounds, context)
    assert any(r.claim > 0 for r in judgement.records), "no takeover happened"
    participants = {p.learner for r in judgement.records for p in r.participants}
    assert participants == {"n0", "n1", "n2", "n3"}, context
