"""Judging a run from its bucket alone: a witness of create-once writes, then the invariants.

The protocol's invariants (:mod:`gm_core.invariants`) read a model store with a
ghost history of every create-once write. A real bucket forgets: snapshots and
claims are swept two cycles behind the commit. So a :class:`Witness` watches the
bucket from outside while the run goes on — it lists ``rounds/``, ``snapshots/``
and ``claims/`` a few times a second and keeps the bytes of every new object,
with the wall time it first saw it — and :func:`judge` builds the store the
invariants expect from the final contents of the bucket plus that history. The
witness talks to the bucket only; it never asks a node anything.

An authenticated run's JSON objects carry the run key's envelope: given the key, the
witness and the judge read each through it (:func:`bodies`), and one that does not open
(a forgery) reads as an empty document: garbage, to the invariants as to the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Collection, Mapping

import attrs

from gm_core import auth, codec, completion, invariants, keys, plan, schedule
from gm_core.check import forger
from gm_core.records import AlgorithmConfig, FragmentState, Manifest, PayloadRef, RoundRecord
from gm_core.store_model import ModelStore, Stored
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import InvalidKeyError, Mailbox, check_key
from gm_shell.reads import read_json
from gm_shell.stores import MailboxOptions

WATCHED = (keys.ROUNDS_PREFIX, keys.SNAPSHOTS_PREFIX, keys.CLAIMS_PREFIX)

Bodies = Callable[[str, bytes], bytes]
"""The body of the object stored at a key."""


def readable(key: str) -> bool:
    """Whether a mailbox can ask for ``key`` (a foreign writer may list others: ``évil.json``)."""
    try:
        check_key(key, "get")
    except InvalidKeyError:
        return False
    return True


def bodies(manifest: bytes, run_key: bytes | None) -> Bodies:
    """How to read a run's objects: through the run key's envelope, or as they are (open).

    ``manifest`` is the manifest as stored, which names the run id the envelope binds.
    """
    if run_key is None:
        return lambda key, data: data
    run_auth = auth.derive(run_key)
    opened = auth.for_run("", run_auth).open(keys.manifest(), manifest)
    assert isinstance(opened, bytes), opened
    envelope = auth.for_run(codec.decode(Manifest, opened).run_id, run_auth)

    def body(key: str, data: bytes) -> bytes:
        if key == keys.manifest():
            return opened
        if not key.endswith(".json"):
            return data  # payloads wear no envelope: records name them by keyed digest
        inside = envelope.open(key, data)
        return inside if isinstance(inside, bytes) else b""

    return body


@attrs.define
class Witness:
    url: str
    options: MailboxOptions
    run_key: bytes | None = None
    foreign: tuple[str, ...] = ()
    """Key prefixes a hostile writer floods: not fetched (nor judged, see :func:`judge`)."""
    every_s: float = 0.15
    seen: dict[str, tuple[bytes, float]] = attrs.field(factory=dict)
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _threads: list[threading.Thread] = attrs.field(factory=list)
    _loop: LoopThread | None = None
    _mailbox: Mailbox | None = None
    _bodies: Bodies | None = None

    def start(self) -> Witness:
        self._loop = LoopThread("witness")
        self._mailbox = Mailbox.open(self.url, options=self.options)
        # One watcher per folder: a flooded folder, slow to list, delays no other.
        self._threads = [
            threading.Thread(target=self._watch, args=(prefix,), name="witness", daemon=True)
            for prefix in WATCHED
        ]
        for thread in self._threads:
            thread.start()
        return self

    def _watch(self, prefix: str) -> None:
        while not self._stop.is_set():
            self.poll(prefix)
            self._stop.wait(self.every_s)

    def poll(self, *prefixes: str) -> None:
        """Look at ``prefixes`` (default: every watched folder) once."""
        assert self._loop is not None
        with contextlib.suppress(Exception):  # a failed look is retried at the next poll
            self._loop.run(self._poll(prefixes or WATCHED), timeout_s=30)

    async def _poll(self, prefixes: tuple[str, ...]) -> None:
        assert self._mailbox is not None
        mailbox = self._mailbox
        listed = await asyncio.gather(*(mailbox.list(prefix) for prefix in prefixes))
        new = [
            item.key
            for items in listed
            for item in items
            if item.key not in self.seen
            and readable(item.key)
            and not item.key.startswith(self.foreign)
        ]
        got = await asyncio.gather(*(read_json(mailbox, key) for key in new))
        for key, value in zip(new, got, strict=True):
            if value is not None:  # (refused, over its kind's cap: b"", garbage like it is)
                self.seen[key] = (value, time.time())

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.poll()  # a last look, after every node has stopped
        if self._loop is not None:
            self._loop.stop()
        if self._mailbox is not None:
            self._mailbox.close()

    def first_seen(self, key: str) -> float:
        return self.seen[key][1]

    def body(self, key: str) -> bytes:
        """The body of a witnessed object (opened with the run key, if the run has one)."""
        if self._bodies is None:
            assert self._loop is not None
            assert self._mailbox is not None
            got = self._loop.run(self._mailbox.get(keys.manifest()), timeout_s=30)
            assert got is not None
            self._bodies = bodies(got.data, self.run_key)
        return self._bodies(key, self.seen[key][0])


@attrs.frozen
class Judgement:
    manifest: Manifest
    records: list[RoundRecord]
    violations: list[invariants.Violation]
    store: ModelStore


def read_bucket(url: str, options: MailboxOptions) -> dict[str, Stored]:
    """Every object under the run prefix, with its bytes and etag."""

    async def read() -> dict[str, Stored]:
        with Mailbox.open(url, options=options) as mailbox:
            items = [item for item in await mailbox.list("") if readable(item.key)]
            got = await asyncio.gather(*(mailbox.get(item.key) for item in items))
        return {
            item.key: Stored(data=value.data, etag=value.etag)
            for item, value in zip(items, got, strict=True)
            if value is not None
        }

    return asyncio.run(read())


def open_tape(objects: Mapping[str, Stored]) -> list[RoundRecord]:
    """The round records (slot 0) among an open run's ``objects``, in round order."""
    envelope = auth.for_run("", None)
    found = []
    for key in sorted(objects):
        parsed = keys.parse(key) if key.startswith(keys.ROUNDS_PREFIX) else None
        if isinstance(parsed, keys.RoundKey) and parsed.name is None:
            body = envelope.open(key, objects[key].data)
            assert isinstance(body, bytes), key
            found.append(codec.decode(RoundRecord, body))
    return found


def judge(
    url: str,
    options: MailboxOptions,
    witness: Witness,
    foreign: Collection[str] = (),
    written: Mapping[str, bytes] | None = None,
) -> Judgement:
    """Every named invariant over the bucket's contents and the witnessed create-once writes.

    ``foreign`` keys (a hostile writer's records that no node adopted, such as one far
    ahead of the tape) and the witness's foreign prefixes are left out: the invariants
    judge what the nodes wrote and adopted. ``written``: create-once writes the nodes
    report themselves (``Harness.written``), which the witness may have missed where a
    sweep beat its looks.
    """
    foreign = (*foreign, *witness.foreign)
    objects = read_bucket(url, options)
    body = bodies(objects[keys.manifest()].data, witness.run_key)
    objects = {
        k: Stored(data=body(k, x.data), etag=x.etag)
        for k, x in objects.items()
        if not k.startswith(foreign)
    }
    manifest = codec.decode(Manifest, objects[keys.manifest()].data)
    created = {
        key: body(key, data)
        for key, (data, _) in witness.seen.items()
        if not key.startswith(foreign)
    }
    created |= {key: body(key, data) for key, data in (written or {}).items()}
    for key, stored in objects.items():
        if key.startswith(WATCHED):
            created.setdefault(key, stored.data)
    store = ModelStore(objects=objects, created=tuple(sorted(created.items())))
    view = invariants.ClusterView(
        manifest=manifest, schema_digest=plan.schema_digest(manifest.schema), store=store
    )
    tape = invariants.read_tape(view)
    return Judgement(
        manifest=manifest,
        records=[tape[r] for r in sorted(tape)],
        violations=invariants.check(view),
        store=store,
    )


def done_markers(objects: Mapping[str, Stored]) -> dict[str, dict[int, object]]:
    """Each queue unit's done markers among an open run's ``objects``, by attempt, judged
    (``completion.decode_done``: a marker, or the verdict on what is there)."""
    done: dict[str, dict[int, object]] = {}
    envelope = auth.for_run("", None)
    for key, stored in objects.items():
        parsed = keys.parse(key) if key.startswith(keys.QUEUE_PREFIX) else None
        if isinstance(parsed, keys.QueueDoneKey):
            body = envelope.open(key, stored.data)
            assert isinstance(body, bytes), key
            done.setdefault(parsed.unit, {})[parsed.attempt] = completion.decode_done(
                body, parsed.attempt
            )
    return done


def committing(
    newest: RoundRecord, round_: int, theta: PayloadRef, config: AlgorithmConfig
) -> RoundRecord:
    """``newest`` copied to ``round_``, committing ``theta`` as the next version of that
    round's fragment (no momentum): a plausible commit of a forger's own model."""
    version = newest.frontier[schedule.fragment_of(round_, config.fragments)].version + 1
    state = FragmentState(version=version, theta=theta, momentum=None)
    return attrs.evolve(forger.next_commit(newest, round_, state, config), outer=None, update=None)
