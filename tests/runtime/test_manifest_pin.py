"""Pinning the manifest (spec/protocol.md §16.5.2, threat-model.md §4.1), real Sessions on file://.

The attack: a bucket writer who sees a run being set up creates the manifest at the
run's new prefix first, with the run's config and schema (so every node adopts it: it
differs from what they would write in nothing they compare) and its own initial model.
Every node, its would-be creator included, then trains from the attacker's parameters.
A node told the real run's manifest digest (trust on first use: the creator's
``run_created`` event, ``Session.manifest_digest`` and ``gm status`` show it) refuses
the forged manifest by name before it trains or loads anything; without the pin the
same node adopts it and holds the attacker's model (the contrast).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from runtime_worker import torch_model
from test_session import FAST, algorithm, flat, train

from gm_core import manifest as core_manifest
from gm_core.records import Manifest
from gm_shell import ManifestPinError, RunError, Session, align, events
from gm_shell.cli import main
from gm_shell.mailbox import Mailbox
from gm_shell.run import create, read_manifest

ATTACKER = 7.0
"""Every initial parameter of the forged run: a model nobody trained."""


def real_run(url: str) -> tuple[str, list[events.Event]]:
    """A run at ``url`` created and trained a little by one node: its digest, its events."""
    model, step = torch_model(seed=0)
    got: list[events.Event] = []
    session = Session(
        model,
        algorithm=algorithm(quorum=1),
        mailbox=url,
        node="creator",
        options=FAST,
        callbacks=[got.append],
    )
    with session:
        train(session, step, 24, seed=0)
        pinned = session.manifest_digest
    assert pinned is not None
    return pinned, got


def forge_at(url: str, real_url: str) -> Manifest:
    """The real run's manifest copied to a new prefix with the attacker's initial model
    (written with gm's own code, as an attacker with the bucket's credentials can)."""

    async def go() -> Manifest:
        async with Mailbox.open(real_url) as real, Mailbox.open(url) as box:
            theirs = await read_manifest(real, None)
            assert theirs is not None
            draft = attrs.evolve(theirs, init=(), created_by="creator")
            shapes = {t.name: t.shape for t in theirs.schema}
            sizes = [sum(math.prod(shapes[n]) for n in f) for f in theirs.plan.fragments]
            values = [np.full(n, ATTACKER, dtype=np.float32) for n in sizes]
            forged = await create(box, draft, values, None)
            assert forged is not None
            return forged

    return asyncio.run(go())


def node_at(url: str, **over: Any) -> tuple[Session, Any]:
    model, _ = torch_model(seed=1)
    fields: dict[str, Any] = {"node": "joiner", "options": FAST, **over}
    session = Session(model, algorithm=algorithm(quorum=1), mailbox=url, **fields)
    return session, model


def test_a_pinned_node_refuses_a_forged_manifest_before_it_trains(tmp_path: Path) -> None:
    real_url, new_url = f"file://{tmp_path / 'real'}", f"file://{tmp_path / 'new'}"
    pinned, got = real_run(real_url)
    created = [e for e in got if isinstance(e, events.RunCreated)]
    assert len(created) == 1
    assert pinned in created[0].detail
    forged = forge_at(new_url, real_url)
    assert core_manifest.digest(forged) != pinned

    session, model = node_at(new_url, manifest_digest=pinned.upper())
    before = flat(model)
    with pytest.raises(ManifestPinError) as refused:
        session.start()
    assert pinned in str(refused.value)
    assert core_manifest.digest(forged) in str(refused.value)
    np.testing.assert_array_equal(flat(model), before)  # nothing loaded
    written = {p.relative_to(tmp_path / "new").as_posix() for p in (tmp_path / "new").rglob("*")}
    assert not any(k.startswith(("leases/", "snapshots/", "rounds/")) for k in written), written

    evaluator, _ = torch_model(seed=2)
    untouched = flat(evaluator)
    with pytest.raises(ManifestPinError):
        align(evaluator, mailbox=new_url, manifest_digest=pinned)
    np.testing.assert_array_equal(flat(evaluator), untouched)
    assert main(["status", new_url, "--manifest-digest", pinned]) == 1

    # The contrast: the same node without the pin adopts the forgery and its model.
    session, model = node_at(new_url)
    with session:
        assert session.manifest_digest == core_manifest.digest(forged)
        np.testing.assert_array_equal(flat(model), np.full(flat(model).size, ATTACKER))


def test_a_pinned_node_joins_the_real_run_and_status_prints_the_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path / 'real'}"
    pinned, _ = real_run(url)
    got: list[events.Event] = []
    session, _model = node_at(url, manifest_digest=pinned, callbacks=[got.append])
    with session:
        rng = np.random.default_rng(3)
        for _ in range(8):
            session.step(samples=rng.integers(1, 4))
    adopted = [e for e in got if isinstance(e, events.RunAdopted)]
    assert adopted
    assert pinned in adopted[0].detail
    evaluator, _ = torch_model(seed=2)
    assert align(evaluator, mailbox=url, manifest_digest=pinned).round >= 0
    assert main(["status", url, "--manifest-digest", pinned]) == 0
    assert pinned in capsys.readouterr().out
    assert main(["status", url, "--json"]) == 0
    assert f'"manifest_digest": "{pinned}"' in capsys.readouterr().out


def test_a_pinned_node_never_creates_a_run(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'empty'}"
    session, _ = node_at(
        url, manifest_digest="ab" * 32, options=attrs.evolve(FAST, join_timeout_s=0.1)
    )
    with pytest.raises(RunError, match="never creates one"):
        session.start()
    assert not (tmp_path / "empty" / "manifest.json").exists()


def test_a_malformed_pin_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="64 hex characters"):
        node_at("memory://pin/run", manifest_digest="abc")
