"""A run ends by itself: a dedicated closer (started first, so it waits for a learner to
create the run, and never creates it) commits every learner's rounds, two learners train
their own data to its end with ``Session.run``, the last to leave writes ``finished.json``,
the closer's ``serve()`` returns on it — and every process exits 0 by itself. A node
started on the finished run is refused by name (``RunFinishedError``)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from procs import result, spawn
from runtime_bucket import open_tape, read_bucket
from runtime_worker import torch_model

from gm_core import completion, keys
from gm_shell import DiLoCo, RunFinishedError, Session, SessionOptions
from gm_shell.mailbox import Mailbox
from gm_shell.run import read_manifest
from gm_shell.stores import MailboxOptions

STEPS = {"a": 24, "b": 40}


def start(url: str, node: str, role: str, **extra: Any) -> subprocess.Popen[str]:
    return spawn("finish_worker.py", {"url": url, "node": node, "role": role, **extra})


@pytest.mark.slow
def test_a_run_finishes_by_itself_and_every_process_exits_0(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    url = f"file://{bucket}"
    closer = start(url, "c", "closer")
    time.sleep(1.0)  # the closer (with a model) waits for the run: it must not create it
    assert closer.poll() is None
    learners = {n: start(url, n, "learner", steps=s, step_s=0.02) for n, s in STEPS.items()}
    procs = {"c": closer, **learners}
    found = {}
    try:
        for name, proc in procs.items():
            found[name] = result(name, proc, timeout_s=240)["finished"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    # The closer returned because the run was finished; the last learner found it so.
    assert found["c"] is True
    assert found["a"] or found["b"]
    summary = completion.decode_summary((bucket / keys.finished()).read_bytes())
    assert isinstance(summary, completion.Summary), summary
    assert summary.by in ("a", "b")
    assert summary.round >= 0
    # The last learner's final (flush) snapshots were committed before it left, the closer
    # closing those rounds with it alone live: its last steps are in the tape.
    tape = open_tape(read_bucket(url, MailboxOptions()))
    finals = [r.round for r in tape for p in r.participants if p.learner == summary.by and p.final]
    assert finals, [(r.round, r.participants) for r in tape[-4:]]
    manifest = asyncio.run(read_manifest(Mailbox.open(url), None))
    assert manifest is not None
    assert manifest.created_by in ("a", "b")
    model, _ = torch_model(0)
    algorithm = DiLoCo(sync_every=4, fragments=2, quorum=1, lease_timeout_s=2.0)
    late = Session(model, algorithm=algorithm, mailbox=url, node="late", options=SessionOptions())
    with pytest.raises(RunFinishedError, match=r"the run is finished at round \d+ \(found by"):
        late.start()
