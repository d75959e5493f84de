"""Figure 3, reference side: what joining a run, and taking over its closing, cost after N rounds.

A run of ``--rounds`` rounds is produced for real: snapshots of one learner are prefilled
(``refkit.prefilled_run``) and a ``Syncer`` closes every round. Then, through a metered
mailbox:

- join: a new ``Learner`` runs ``join()``, everything ``Session.join`` does before training
  starts (read the manifest, the tape and the newest payload of every fragment);
- takeover: a new ``Syncer`` runs ``recover()``, the reload a node does when it takes the
  closing of a round over (the reference's ``follow`` calls it right after its claim);
- takeover to commit: with the tape's closer gone (it claimed the next round before it
  stopped, as it does after every commit), the next round's snapshot is written and a new
  ``Syncer`` runs until it has committed that round: it recovers, follows the silent
  claimant, claims the round, recovers again and closes it. These are the requests gm's
  side counts from its successor's start to its first commit.

Each is run twice: without latency (requests, wall time) and with ``--latency-ms`` per
request (wall time, and the number of sequential request waves). Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from gradientmail import DiLoCo, MemoryAdapter, MemoryMailbox
from gradientmail.learner import Learner
from gradientmail.syncer import Syncer
from journal import Journal, by_category, by_class, waves
from numpy_adapter import NumpyBackend, tensors_of
from refkit import MeteredMailbox, emit, model_arrays, prefill, prefilled_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--sync-every", type=int, default=120)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--elements", type=int, default=256)
    parser.add_argument("--poll", type=float, default=0.05, help="the successor's poll, s")
    args = parser.parse_args()

    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments)
    init = model_arrays(args.tensors, args.elements)
    store = MemoryMailbox()
    started = time.perf_counter()
    asyncio.run(prefilled_run(store, algorithm, init, args.rounds, learners=("learner-a",)))
    closer = Syncer(
        algorithm=algorithm,
        mailbox=store,
        node_id="closer",
        backend=NumpyBackend(),
        poll_interval=0.01,
        on_event=lambda _event: None,
    )
    asyncio.run(closer.run(until_round=args.rounds - 1))
    built_s = time.perf_counter() - started

    def measure(
        what: str, run: Callable[[MeteredMailbox], Awaitable[object]], *, to_record: bool = False
    ) -> dict[str, object]:
        """Requests of ``run``; with ``to_record``, only those sent up to its record's write."""
        result: dict[str, object] = {}
        for latency_ms in (0.0, args.latency_ms):
            journal = Journal()
            mailbox = MeteredMailbox(store, node=what, journal=journal, latency_s=latency_ms / 1e3)
            t0 = time.perf_counter()
            asyncio.run(run(mailbox))
            wall = time.perf_counter() - t0
            requests = journal.snapshot()
            if to_record:
                committed = min(r.ended for r in requests if r.category == "rounds" and r.created)
                requests = [r for r in requests if r.started < committed]
                wall = committed - t0
            if latency_ms == 0.0:
                result["requests"] = by_class(requests)
                result["by_object"] = by_category(requests)
                result["wall_s"] = wall
            else:
                result["latency_ms"] = latency_ms
                result["wall_s_at_latency"] = wall
                result["waves_at_latency"] = waves(requests)
        return result

    async def join(mailbox: MeteredMailbox) -> None:
        learner = Learner(
            adapter=MemoryAdapter(tensors_of(init)),
            algorithm=algorithm,
            mailbox=mailbox,
            node_id="joiner",
            backend=NumpyBackend(),
            on_event=lambda _event: None,
        )
        await learner.join()

    async def takeover(mailbox: MeteredMailbox) -> None:
        syncer = Syncer(
            algorithm=algorithm,
            mailbox=mailbox,
            node_id="successor",
            backend=NumpyBackend(),
            on_event=lambda _event: None,
        )
        await syncer.recover()

    async def to_commit(mailbox: MeteredMailbox) -> None:
        # Each pass closes the next round: the previous successor claimed it after its commit.
        successor = Syncer(
            algorithm=algorithm,
            mailbox=mailbox,
            node_id="successor",
            backend=NumpyBackend(),
            poll_interval=args.poll,
            on_event=lambda _event: None,
        )
        await successor.run(until_round=next_round.pop(0))

    joined = measure("joiner", join)
    recovered = measure("successor", takeover)
    next_round = [args.rounds, args.rounds + 1]
    asyncio.run(
        prefill(store, algorithm, init, range(args.rounds, args.rounds + 2), ("learner-a",))
    )
    emit(
        {
            "ok": True,
            "rounds": args.rounds,
            "fragments": args.fragments,
            "build_s": built_s,
            "join": joined,
            "takeover": recovered,
            "takeover_to_commit": measure("successor", to_commit, to_record=True),
            "join_what": "gradientmail.learner.Learner.join() (what Session.join runs first)",
            "takeover_what": "gradientmail.syncer.Syncer.recover() (run at every takeover)",
        }
    )


if __name__ == "__main__":
    main()
