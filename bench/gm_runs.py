"""gm's side of the comparison's figures 1-3: real ``Session``s over a bucket with a round trip.

Every figure here runs gm's real runtime — ``gm_shell.Session`` nodes with their event loops,
core machines, payload codecs and mailboxes — over one in-memory obstore bucket that every
request reaches through :mod:`latency` (a fixed sleep per request, a journal of every request).
No part of gm's side is modelled. What the bench writes itself is only what stands in for
learners that are not the subject of a figure: a run's manifest and initial payloads
(:func:`gm_shell.run.create`, as the first node does) and learners' snapshots (payload, then
record, exactly the objects a learner publishes), so that a closer alone can be timed.

- :func:`requests_per_round` (figure 1): ``nodes`` sessions, role both, train a small torch
  model on a clock scaled by ``scale``; the steady-state window runs from round 1's commit to
  the last commit before the first node stops.
- :func:`critical_path` (figure 2): every round's four snapshots are in the bucket; one
  closer-only session closes round after round; round time is the median interval between
  record writes, its sequential requests counted as waves and as the slope over latency.
- :func:`join_and_takeover` (figure 3): a closer-only session writes a ``rounds``-round tape;
  then a learner joins (requests until its ``joined`` event), and, with the tape's closer
  gone, a closer-only session takes the next round over (requests until its ``took_over``
  event, and until its first commit).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from obstore.store import LocalStore, MemoryStore

from gm_core import auth, keys, plan
from gm_core.records import Manifest, Member, Roster, Snapshot
from gm_shell import nodekeys
from gm_shell.events import Committed, Event, Joined, TookOver
from gm_shell.fragments import FragmentCodec, Role, payload_key
from gm_shell.mailbox import Mailbox
from gm_shell.models import adapt
from gm_shell.replica import Replica
from gm_shell.run import create, draft_manifest
from gm_shell.runkey import resolve
from gm_shell.session import DiLoCo, Session, SessionOptions

try:  # run as ``python bench/compare.py`` (bench/ on sys.path) or imported as ``bench.gm_runs``
    from bench.latency import slow_mailbox
    from bench.reference.journal import Journal, Request, by_category, by_class, waves
except ModuleNotFoundError:
    from latency import slow_mailbox
    from reference.journal import Journal, Request, by_category, by_class, waves

LEARNERS = ("learner-a", "learner-b", "learner-c", "learner-d")
SETUP = "setup"
CLOSERS = ("closer",)
"""The closer-only nodes of the critical-path runs (on the roster of a signed run)."""


def node_key(node: str) -> bytes:
    """A fixed Ed25519 private key per node id: the figures do not depend on it."""
    return hashlib.sha256(b"gm bench node key " + node.encode()).digest()


def bench_roster(roles: dict[str, tuple[str, ...]]) -> Roster:
    """A roster of ``roles``' nodes with their :func:`node_key`, signed by a fixed authority."""
    members = [
        Member(node=n, roles=r, public_key=nodekeys.public_key(node_key(n)))
        for n, r in sorted(roles.items())
    ]
    return nodekeys.make_roster(node_key("authority"), members)


"""The journal's name for the bench's own writes (run creation, prefilled snapshots)."""


def torch_model(tensors: int, elements: int, seed: int = 0) -> torch.nn.Module:
    """``tensors`` fp32 vectors of ``elements`` named ``layer00``.. (the reference's model)."""
    torch.manual_seed(seed)
    model = torch.nn.Module()
    for i in range(tensors):
        model.register_parameter(f"layer{i:02d}", torch.nn.Parameter(torch.randn(elements) * 0.02))
    return model


class Watcher:
    """Collects a session's events; lets the bench thread wait for one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def count(self, found: Callable[[Event], bool]) -> int:
        """How many events so far ``found`` accepts."""
        with self._cond:
            return sum(1 for e in self.events if found(e))

    def wait(self, found: Callable[[Event], bool], timeout_s: float) -> Event:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                hit = next((e for e in self.events if found(e)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [e.kind for e in self.events[-5:]]
                    raise TimeoutError(f"no such event within {timeout_s:g} s (last: {kinds})")
                self._cond.wait(left)


def committed(round_: int) -> Callable[[Event], bool]:
    return lambda e: isinstance(e, Committed) and e.round >= round_


class Bucket:
    """One run's bucket: the shared store, the journal, and mailboxes onto it.

    ``store``: an in-memory one unless given (a ``LocalStore`` puts the run on disk, as
    ``file://`` does). ``run_key``: the run's key (None: an open run); the bench's own
    writes are then sealed and keyed as a node's would be, and its sessions get the key.
    """

    def __init__(
        self,
        algorithm: DiLoCo,
        tensors: int,
        elements: int,
        *,
        store: MemoryStore | LocalStore | None = None,
        run_key: bytes | None = None,
        roster: Roster | None = None,
    ) -> None:
        self.store = store if store is not None else MemoryStore()
        self.run_key = run_key
        self.run_auth = resolve(run_key, "memory://")
        self.roster = roster
        """Per-node keys (a run key too): every node signs with its :func:`node_key`."""
        self.journal = Journal()
        self.algorithm = algorithm
        self.model = torch_model(tensors, elements)
        self._mailboxes: list[Mailbox] = []

    def mailbox(self, node: str, latency_s: float = 0.0) -> Mailbox:
        mailbox = slow_mailbox(self.store, node=node, journal=self.journal, latency_s=latency_s)
        self._mailboxes.append(mailbox)
        return mailbox

    def close(self) -> None:
        for mailbox in self._mailboxes:
            mailbox.close()

    def create_run(self, creator: str) -> Manifest:
        """The manifest and initial payloads, as ``creator``'s first session would write them."""
        adapter = adapt(self.model)
        draft = draft_manifest(
            run_id="bench",
            node=creator,
            config=self.algorithm.config(),
            schema=adapter.schema(),
            run_auth=self.run_auth,
            roster=self.roster,
        )
        replica = Replica(adapter, draft.plan)
        values = [replica.read(f) for f in range(len(draft.plan.fragments))]
        manifest = asyncio.run(create(self.mailbox(SETUP), draft, values, self.run_auth))
        assert manifest is not None
        return manifest

    def prefill(self, manifest: Manifest, rounds: range, learners: Sequence[str]) -> None:
        """Write ``learners``' snapshots of ``rounds`` as they would publish them.

        Payload first, then the record; the base version is the fragment's version once every
        earlier round has committed, and the step time is zero so the grace window stays shut.
        """
        fragments = FragmentCodec(manifest, payload_key=payload_key(self.run_auth))
        envelopes = {n: self.envelope(manifest, n, ("learner",)) for n in learners}
        cfg = manifest.config
        digest = plan.schema_digest(manifest.schema)
        gap = cfg.sync_every // cfg.fragments
        rng = np.random.default_rng(rounds.start)
        mailbox = self.mailbox(SETUP)

        async def publish(round_: int, index: int, learner: str) -> None:
            fragment = round_ % cfg.fragments
            delta = (rng.standard_normal(fragments.size(fragment)) * 1e-3).astype(np.float32)
            data, ref = await asyncio.to_thread(
                fragments.encode, fragment, Role.DELTA, round_, delta
            )
            await mailbox.put_once(ref.key, data)
            snapshot = Snapshot(
                learner=learner,
                round=round_,
                fragment=fragment,
                base_version=round_ // cfg.fragments,
                steps=gap,
                tokens=gap * (256 + index),
                step_s=0.0,
                schema_digest=digest,
                payload=ref,
            )
            key = keys.snapshot(round_, learner)
            await mailbox.put_once(key, envelopes[learner].pack(key, snapshot))

        async def all_of_them() -> None:
            for first in range(rounds.start, rounds.stop, 64):
                chunk = range(first, min(first + 64, rounds.stop))
                await asyncio.gather(
                    *(publish(r, i, n) for r in chunk for i, n in enumerate(learners))
                )

        asyncio.run(all_of_them())

    def envelope(self, manifest: Manifest, node: str, roles: tuple[str, ...]) -> auth.Envelope:
        """How ``node`` seals its objects in this run (signing them with per-node keys)."""
        private = node_key(node) if self.roster is not None else None
        signing = nodekeys.signing_for(manifest, node, private, roles)
        return auth.of_run(manifest, nodekeys.with_signing(self.run_auth, signing))

    def closer(self, node: str, latency_s: float, poll_s: float, watcher: Watcher) -> Session:
        session = Session(
            None,
            algorithm=self.algorithm,
            mailbox=self.mailbox(node, latency_s),
            node=node,
            role="closer",
            options=SessionOptions(poll_s=poll_s, compute="numpy"),
            callbacks=(watcher,),
            run_key=self.run_key,
            node_key=node_key(node) if self.roster is not None else None,
        )
        session.start()
        return session


# --- figure 1 -------------------------------------------------------------------------------

LOAD_SLACK = 10
"""How many times its nominal steps a node of figure 1 may train waiting for the commits."""


def requests_per_round(
    *,
    nodes: int,
    poll_s: float,
    step_s: float,
    sync_every: int,
    fragments: int,
    rounds: int,
    scale: float,
    latency_ms: float,
) -> dict[str, Any]:
    """Requests per round of ``nodes`` sessions (role both) sharing one bucket.

    Time is scaled as on the reference side: every protocol second (poll, step, lease timeout,
    takeover floor, and the per-request latency) lasts ``scale`` s. gm's takeover floor is set
    to three rounds: its 10 s default is shorter than this scenario's first round (30 s), which
    has no timing estimates yet, and followers would take round 0 over.

    Each node trains the steps of ``rounds + 2`` rounds, and on past them (up to
    ``LOAD_SLACK`` times as many) until ``rounds`` rounds after the first are committed: on a
    loaded machine the commits trail the steps by ``in_flight`` rounds, and a fixed step count
    left too few of them in the window (the window ends when the first node stops).
    """
    round_s = sync_every // fragments * step_s
    steps = (rounds + 2) * (sync_every // fragments)
    algorithm = DiLoCo(
        sync_every=sync_every,
        fragments=fragments,
        lease_timeout_s=30.0 * scale,
        takeover_floor_s=3 * round_s * scale,
    )
    options = SessionOptions(
        poll_s=poll_s * scale,
        stall_timeout_s=120.0,
        join_timeout_s=120.0,
        close_timeout_s=30.0,
        compute="numpy",
    )
    bucket = Bucket(algorithm, 8, 4096)
    watcher = Watcher()
    stopped: list[float] = []
    failures: list[str] = []

    def counted(event: Event) -> bool:
        return isinstance(event, Committed) and event.round >= 1

    def node(name: str) -> None:
        model = torch_model(8, 4096)
        try:
            with Session(
                model,
                algorithm=algorithm,
                mailbox=bucket.mailbox(name, latency_ms / 1e3 * scale),
                node=name,
                options=options,
                callbacks=(watcher,),
            ) as session:
                for done in range(steps * LOAD_SLACK):
                    if done >= steps and watcher.count(counted) >= rounds:
                        break
                    time.sleep(step_s * scale)
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 1e-3)
                    session.step(samples=256)
                stopped.append(time.monotonic())
        except Exception as error:
            failures.append(f"{name}: {type(error).__name__}: {error}")

    names = [f"node-{i}" for i in range(nodes)]
    threads = [threading.Thread(target=node, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    bucket.close()
    end = min(stopped, default=math.inf)
    commits = sorted(
        (e.round, e.at_s, e.participants) for e in watcher.events if counted(e) and e.at_s <= end
    )
    if len(commits) < 3:
        why = "; ".join(failures) or f"{len(commits)} commits in the window"
        return {"error": f"too few rounds in the steady state ({why})"}
    (r0, t0, _), (r1, t1, _) = commits[0], commits[-1]
    window = [r for r in bucket.journal.requests() if r.node in names and t0 < r.ended <= t1]
    count = r1 - r0
    return {
        "runtime": f"real: gm_shell.Session x{nodes} (role both), torch model, "
        f"one memory bucket via the slow store ({latency_ms:g} ms a request, scaled)",
        "failures": failures,
        "scale": scale,
        "latency_ms": latency_ms,
        "window": [r0, r1],
        "window_rounds": count,
        "round_s": (t1 - t0) / count / scale,
        "per_round": {k: v / count for k, v in by_class(window).items()},
        "per_round_by_object": {
            cat: {cls: n / count for cls, n in counts.items()}
            for cat, counts in by_category(window).items()
        },
        "participants_per_round": statistics.fmean(p for _, _, p in commits[1:]),
    }


# --- figure 2 -------------------------------------------------------------------------------


def critical_path(
    *,
    latencies_ms: Sequence[float],
    rounds: int,
    sync_every: int,
    fragments: int,
    tensors: int,
    elements: int,
    run_key: bytes | None = None,
    folder: Path | None = None,
    signed: bool = False,
) -> dict[str, Any]:
    """A closer alone closes ``rounds`` prefilled rounds at each latency (a fresh bucket each).

    ``run_key``: the run's key (None: open); ``folder``: where to put each bucket on disk
    (a fresh sub-folder per latency; None: in memory); ``signed``: per-node keys too
    (every snapshot signed by its learner, every object the closer writes by it).
    """
    roles = {**dict.fromkeys(LEARNERS, ("learner",)), **dict.fromkeys(CLOSERS, ("closer",))}
    roster = bench_roster(roles) if signed else None
    results = []
    for latency_ms in latencies_ms:
        algorithm = DiLoCo(sync_every=sync_every, fragments=fragments, quorum=len(LEARNERS))
        store = None
        if folder is not None:
            where = Path(tempfile.mkdtemp(prefix=f"{latency_ms:g}ms-", dir=folder))
            store = LocalStore(where)
        bucket = Bucket(algorithm, tensors, elements, store=store, run_key=run_key, roster=roster)
        try:
            manifest = bucket.create_run("closer")
            bucket.prefill(manifest, range(rounds), LEARNERS)
            watcher = Watcher()
            session = bucket.closer("closer", latency_ms / 1e3, 0.05, watcher)
            try:
                watcher.wait(committed(rounds - 1), timeout_s=600)
            finally:
                session.close()
        finally:
            bucket.close()
        results.append(_path_row(bucket.journal.requests("closer"), latency_ms))
    base = next((r for r in results if r["latency_ms"] == 0.0), None)
    for row in results:
        if base is not None and row["latency_ms"] > 0:
            row["slope_requests"] = (row["round_s_median"] - base["round_s_median"]) / (
                row["latency_ms"] / 1e3
            )
    return {
        "runtime": "real: gm_shell.Session (role closer) over the slow store, snapshots "
        "prefilled, numpy merge",
        "fragment_bytes": tensors // fragments * elements * 4,
        "results": results,
    }


def _path_row(requests: list[Request], latency_ms: float) -> dict[str, Any]:
    """Round times and sequential requests, from the closer's journal alone."""
    writes = sorted(r.ended for r in requests if r.category == "rounds" and r.cls == "PUT")[
        2:
    ]  # the first rounds boot the closer and warm its caches
    intervals, round_waves, after_merge, inside_all = [], [], [], []
    for t0, t1 in itertools.pairwise(writes):
        inside = [r for r in requests if t0 < r.started and r.ended <= t1]
        intervals.append(t1 - t0)
        round_waves.append(waves(inside))
        inside_all.extend(inside)
        # The merge starts once its last input (a delta payload) is in; what follows up to the
        # record is the commit's own requests (the reference counts from its RoundClosed).
        inputs = [r.ended for r in inside if r.category == "payloads" and r.cls == "GET"]
        if inputs:
            after_merge.append(waves(r for r in inside if r.started >= max(inputs)))
    count = len(intervals)
    return {
        "latency_ms": latency_ms,
        "rounds_timed": count,
        "round_s_median": statistics.median(intervals),
        "round_s_mean": statistics.fmean(intervals),
        "waves_median": statistics.median(round_waves),
        "commit_waves_median": statistics.median(after_merge) if after_merge else None,
        "requests_per_round": {k: v / count for k, v in by_class(inside_all).items()},
    }


# --- figure 3 -------------------------------------------------------------------------------


def join_and_takeover(
    *, rounds: int, latency_ms: float, sync_every: int, fragments: int
) -> dict[str, Any]:
    """Join and take over a real ``rounds``-round tape, at zero latency and at ``latency_ms``."""
    algorithm = DiLoCo(sync_every=sync_every, fragments=fragments)
    bucket = Bucket(algorithm, 8, 256)
    try:
        started = time.monotonic()
        manifest = build_tape(bucket, rounds)
        built_s = time.monotonic() - started
        result: dict[str, Any] = {
            "runtime": "real: gm_shell.Session (learner; closer) over the slow store",
            "rounds": rounds,
            "build_s": built_s,
        }
        result["join"] = {
            f"at_{ms:g}": _join(bucket, f"joiner-{i}", ms) for i, ms in enumerate((0, latency_ms))
        }
        bucket.prefill(manifest, range(rounds, rounds + 2), LEARNERS[:1])
        result["takeover"] = {
            f"at_{ms:g}": _takeover(bucket, f"successor-{i}", ms, rounds + i)
            for i, ms in enumerate((0, latency_ms))
        }
        return result
    finally:
        bucket.close()


def _join(bucket: Bucket, node: str, latency_ms: float) -> dict[str, Any]:
    """A learner session's requests from its start to its ``joined`` event (the model loaded)."""
    mine, seconds = join_requests(bucket, node, latency_ms)
    return {
        "latency_ms": latency_ms,
        "requests": by_class(mine),
        "by_object": by_category(mine),
        "seconds": seconds,
        "waves": waves(mine),
    }


def build_tape(bucket: Bucket, rounds: int) -> Manifest:
    """A run of ``rounds`` committed rounds in ``bucket`` (one learner's snapshots, closed by a
    closer that then leaves); its manifest."""
    manifest = bucket.create_run("closer")
    bucket.prefill(manifest, range(rounds), LEARNERS[:1])
    watcher = Watcher()
    tape = bucket.closer("closer", 0.0, 0.05, watcher)
    try:
        watcher.wait(committed(rounds - 1), timeout_s=1800)
    finally:
        tape.close()  # leaves: its lease is released, so its successor need not wait
    return manifest


def join_requests(bucket: Bucket, node: str, latency_ms: float) -> tuple[list[Request], float]:
    """A learner session joins the run: its requests from its start to its ``joined`` event
    (the model loaded), and the seconds that took."""
    watcher = Watcher()
    session = Session(
        torch_model(8, 256, seed=1),
        algorithm=bucket.algorithm,
        mailbox=bucket.mailbox(node, latency_ms / 1e3),
        node=node,
        role="learner",
        options=SessionOptions(close_timeout_s=1.0, compute="numpy"),
        callbacks=(watcher,),
    )
    t0 = time.monotonic()
    session.start()
    try:
        joined = watcher.wait(lambda e: isinstance(e, Joined), timeout_s=120)
    finally:
        session.close()
    return bucket.journal.requests(node, since=t0, until=joined.at_s), joined.at_s - t0


def _takeover(bucket: Bucket, node: str, latency_ms: float, round_: int) -> dict[str, Any]:
    """A closer-only session on a tape whose closer left: to its claim, and to its first commit."""
    watcher = Watcher()
    t0 = time.monotonic()
    session = bucket.closer(node, latency_ms / 1e3, 0.05, watcher)
    try:
        took = watcher.wait(lambda e: isinstance(e, TookOver), timeout_s=300)
        done = watcher.wait(committed(round_), timeout_s=300)
    finally:
        session.close()
    claimed = bucket.journal.requests(node, since=t0, until=took.at_s)
    first = bucket.journal.requests(node, since=t0, until=done.at_s)
    return {
        "latency_ms": latency_ms,
        "round": took.round,
        "to_claim": by_class(claimed),
        "to_commit": by_class(first),
        "by_object": by_category(first),
        "seconds_to_claim": took.at_s - t0,
        "seconds_to_commit": done.at_s - t0,
        "waves_to_commit": waves(first),
    }
