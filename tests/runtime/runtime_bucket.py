"""Judging a run from its bucket alone: a witness of create-once writes, then the invariants.

The protocol's invariants (:mod:`gm_core.invariants`) read a model store with a
ghost history of every create-once write. A real bucket forgets: snapshots and
claims are swept two cycles behind the commit. So a :class:`Witness` watches the
bucket from outside while the run goes on — it lists ``rounds/``, ``snapshots/``
and ``claims/`` a few times a second and keeps the bytes of every new object,
with the wall time it first saw it — and :func:`judge` builds the store the
invariants expect from the final contents of the bucket plus that history. The
witness talks to the bucket only; it never asks a node anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import attrs

from gm_core import codec, invariants, keys, plan
from gm_core.records import Manifest, RoundRecord
from gm_core.store_model import ModelStore, Stored
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.stores import MailboxOptions

WATCHED = (keys.ROUNDS_PREFIX, keys.SNAPSHOTS_PREFIX, keys.CLAIMS_PREFIX)


@attrs.define
class Witness:
    url: str
    options: MailboxOptions
    every_s: float = 0.15
    seen: dict[str, tuple[bytes, float]] = attrs.field(factory=dict)
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop: LoopThread | None = None
    _mailbox: Mailbox | None = None

    def start(self) -> Witness:
        self._loop = LoopThread("witness")
        self._mailbox = Mailbox.open(self.url, options=self.options)
        self._thread = threading.Thread(target=self._watch, name="witness", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.every_s)

    def poll(self) -> None:
        assert self._loop is not None
        with contextlib.suppress(Exception):  # a failed look is retried at the next poll
            self._loop.run(self._poll(), timeout_s=30)

    async def _poll(self) -> None:
        assert self._mailbox is not None
        mailbox = self._mailbox
        listed = await asyncio.gather(*(mailbox.list(prefix) for prefix in WATCHED))
        new = [item.key for items in listed for item in items if item.key not in self.seen]
        got = await asyncio.gather(*(mailbox.get(key) for key in new))
        for key, value in zip(new, got, strict=True):
            if value is not None:
                self.seen[key] = (value.data, time.time())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.poll()  # a last look, after every node has stopped
        if self._loop is not None:
            self._loop.stop()
        if self._mailbox is not None:
            self._mailbox.close()

    def first_seen(self, key: str) -> float:
        return self.seen[key][1]


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
            items = await mailbox.list("")
            got = await asyncio.gather(*(mailbox.get(item.key) for item in items))
        return {
            item.key: Stored(data=value.data, etag=value.etag)
            for item, value in zip(items, got, strict=True)
            if value is not None
        }

    return asyncio.run(read())


def judge(url: str, options: MailboxOptions, witness: Witness) -> Judgement:
    """Every named invariant over the bucket's contents and the witnessed create-once writes."""
    objects = read_bucket(url, options)
    manifest = codec.decode(Manifest, objects[keys.manifest()].data)
    created = {key: data for key, (data, _) in witness.seen.items()}
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
