"""Shared pieces of the reference-side harness: a metered mailbox, a model, a prefilled run.

Runs under ``bench/.venv-ref`` (Python 3.12, gradientmail 0.0.2, numpy). Each ``fig_*.py``
script prints one JSON object on stdout; ``bench/compare.py`` reads it.

Request classes and how they are counted, as the reference's own S3 mailbox would send them:

- ``put_if_absent`` is one PUT; ``get`` one GET;
- ``list`` is one LIST per page of 1000 keys (at least one);
- ``delete`` is one DELETE per batch of 1000 keys (none for an empty batch, as its S3
  mailbox sends nothing then).

A per-request latency, when asked for, is slept before each request (once per LIST page or
DELETE batch), on the caller's event loop, as a remote store's round trip would be.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence

import numpy as np
from gradientmail import DiLoCo, MemoryAdapter
from gradientmail.clock import Clock, MonotonicClock
from gradientmail.learner import Learner
from gradientmail.mailbox import Mailbox
from gradientmail.protocol import Exchange, SnapshotDraft
from journal import Journal, Request, category_of
from numpy_adapter import NumpyBackend, tensors_of

LIST_PAGE_KEYS = 1000
DELETE_BATCH_KEYS = 1000


class MeteredMailbox(Mailbox):
    """Wraps a reference ``Mailbox``: counts each request, optionally delays it."""

    def __init__(
        self, inner: Mailbox, *, node: str, journal: Journal, latency_s: float = 0.0
    ) -> None:
        self._inner = inner
        self._node = node
        self._journal = journal
        self.latency_s = latency_s

    async def _delay(self, requests: int) -> None:
        if self.latency_s > 0 and requests > 0:
            await asyncio.sleep(self.latency_s * requests)

    def _note(
        self,
        started: float,
        cls: str,
        count: int,
        key: str,
        created: bool | None = None,
    ) -> None:
        self._journal.add(
            Request(
                started=started,
                ended=time.perf_counter(),
                node=self._node,
                cls=cls,
                count=count,
                category=category_of(key),
                key=key,
                created=created,
            )
        )

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        started = time.perf_counter()
        await self._delay(1)
        created = await self._inner.put_if_absent(key, data)
        self._note(started, "PUT", 1, key, created)
        return created

    async def get(self, key: str) -> bytes | None:
        started = time.perf_counter()
        await self._delay(1)
        data = await self._inner.get(key)
        self._note(started, "GET", 1, key)
        return data

    async def list(self, prefix: str, *, after: str = "") -> Sequence[str]:
        started = time.perf_counter()
        keys = await self._inner.list(prefix, after=after)
        pages = max(1, math.ceil(len(keys) / LIST_PAGE_KEYS))
        await self._delay(pages)
        self._note(started, "LIST", pages, prefix)
        return keys

    async def delete(self, keys: Iterable[str]) -> None:
        started = time.perf_counter()
        todo = list(keys)
        batches = math.ceil(len(todo) / DELETE_BATCH_KEYS)
        await self._delay(batches)
        await self._inner.delete(todo)
        if batches:
            self._note(started, "DELETE", batches, todo[0])

    def clock(self) -> Clock:
        return self._inner.clock()


def model_arrays(
    tensors: int, elements: int, seed: int = 0, *, scale: float = 0.02
) -> dict[str, np.ndarray]:
    """``tensors`` fp32 tensors of ``elements`` each, named so byte-balanced plans pair them."""
    rng = np.random.default_rng(seed)
    return {
        f"layer{i:02d}.weight": (rng.standard_normal(elements) * scale).astype(np.float32)
        for i in range(tensors)
    }


LEARNERS = ("learner-a", "learner-b", "learner-c", "learner-d")


async def prefilled_run(
    store: Mailbox,
    algorithm: DiLoCo,
    init: dict[str, np.ndarray],
    rounds: int,
    learners: Sequence[str] = LEARNERS,
) -> None:
    """Create the run, then write every round's snapshots as ``learners`` would publish them."""
    creator = Learner(
        adapter=MemoryAdapter(tensors_of(init)),
        algorithm=algorithm,
        mailbox=store,
        node_id="creator",
        backend=NumpyBackend(),
        on_event=lambda _event: None,
    )
    await creator.join()
    await prefill(store, algorithm, init, range(rounds), learners)


async def prefill(
    store: Mailbox,
    algorithm: DiLoCo,
    init: dict[str, np.ndarray],
    rounds: range,
    learners: Sequence[str] = LEARNERS,
) -> None:
    """Write ``learners``' snapshots of ``rounds`` into an existing run.

    Each snapshot is accepted by a closer that reaches its round: its base version is the
    fragment's version by then, and it reports zero step time, so the adaptive grace window
    stays closed and a round closes as soon as its snapshots are read.
    """
    exchange = Exchange(store, clock=MonotonicClock())
    manifest = await exchange.manifest()
    assert manifest is not None
    schedule = algorithm.schedule(len(manifest.plan))
    digest = manifest.schema.digest()
    rng = np.random.default_rng(7 + rounds.start)
    gap = schedule.gap(1)
    for round in rounds:
        fragment = schedule.fragment_of(round)
        for index, learner in enumerate(learners):
            delta = {
                name: (rng.standard_normal(init[name].shape) * 1e-3).astype(np.float32)
                for name in manifest.plan[fragment]
            }
            draft = SnapshotDraft(
                learner=learner,
                round=round,
                local_step=(round + 1) * gap,
                steps=gap,
                tokens=gap * (256 + index),
                # Fragment ``round mod P`` has been committed ``round div P`` times before.
                base_version=round // schedule.fragments,
                rounds_seen=round - 1,
                step_seconds=0.0,
                schema_digest=digest,
                final=False,
            )
            await exchange.publish_snapshot(draft, tensors_of(delta))


def emit(payload: dict[str, object]) -> None:
    """Print the figure as one JSON object (the only thing a script writes to stdout)."""
    payload.setdefault(
        "versions",
        {"python": sys.version.split()[0], "numpy": np.__version__, "gradientmail": _version()},
    )
    json.dump(payload, sys.stdout, indent=None, sort_keys=True)
    sys.stdout.write("\n")
    sys.stdout.flush()


def _version() -> str:
    from importlib.metadata import version

    return version("gradientmail")
