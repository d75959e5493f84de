"""``Session(ranks=N)`` across processes: a rank holder paused (SIGSTOP) past the lease
timeout loses its rank to a waiting peer — the newest claim wins — and, once it runs
again, gets ``RankLost`` from ``step()`` at its next watch; the peer trains the slice to
its end, writes the rank's only done marker and finds the run finished. On a local folder
and on SeaweedFS."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from gm_core import auth, completion, keys, ranks
from gm_shell import MailboxOptions
from gm_shell.mailbox import Mailbox

HERE = Path(__file__).parent
WORKER = HERE / "rank_worker.py"
STEPS = 40


def start(
    run: tuple[str, MailboxOptions], node: str, trace: Path, steps: int, step_s: float
) -> subprocess.Popen[str]:
    url, options = run
    spec = {"url": url, "node": node, "ranks": 1, "steps": steps, "step_s": step_s}
    spec |= {"trace": str(trace), "mailbox": attrs.asdict(options)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def read_bucket(url: str, options: MailboxOptions) -> tuple[dict[int, Any], bytes | None]:
    """The rank's done markers (judged; every key under its folder must be one) and
    ``finished.json``."""
    envelope = auth.for_run("", None)
    markers = {}
    with Mailbox.open(url, options=options) as box:
        prefix = keys.queue_unit_prefix(ranks.QUEUE, ranks.unit(0))
        for item in await box.list(prefix):
            parsed = keys.parse(item.key)
            assert isinstance(parsed, keys.QueueDoneKey), parsed  # claims were collected
            got = await box.get(item.key)
            assert got is not None
            body = envelope.open("", got.data)
            assert isinstance(body, bytes)
            markers[parsed.attempt] = completion.decode_done(body, parsed.attempt)
        finished = await box.get(keys.finished())
    return markers, None if finished is None else finished.data


@pytest.mark.slow
def test_a_paused_rank_holder_comes_back_and_gets_rank_lost(
    tmp_path: Path, run_url: tuple[str, MailboxOptions]
) -> None:
    traces = {n: tmp_path / f"{n}.trace" for n in ("a", "b")}
    # a's slice would take minutes: it is still training when it is paused.
    holder = start(run_url, "a", traces["a"], steps=100_000, step_s=0.05)
    deadline = time.monotonic() + 150

    def lines(node: str) -> list[str]:
        return traces[node].read_text().splitlines() if traces[node].exists() else []

    def wait(what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            assert time.monotonic() < deadline, what
            assert holder.poll() is None, holder.communicate()
            time.sleep(0.02)

    try:
        wait("a never trained", lambda: bool(lines("a")))
        peer = start(run_url, "b", traces["b"], steps=STEPS, step_s=0.02)
        # b waits in start() while a holds the only rank live; paused, a's lease stops
        # changing, and after the lease timeout on b's clock b claims the rank over it.
        holder.send_signal(signal.SIGSTOP)
        try:
            while not lines("b"):
                assert time.monotonic() < deadline, "b never took the rank over"
                assert peer.poll() is None, peer.communicate()
                time.sleep(0.05)
        finally:
            holder.send_signal(signal.SIGCONT)
        out, err = holder.communicate(timeout=120)
        assert holder.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"lost": 0, "attempt": 0, "node": "a"}
        out, err = peer.communicate(timeout=120)
        assert peer.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"rank": 0, "finished": True}
    finally:
        for proc in (holder, locals().get("peer")):
            if isinstance(proc, subprocess.Popen) and proc.poll() is None:
                proc.kill()
                proc.communicate()
    # The rank's only done marker is b's, under the claim that took it over.
    markers, finished = asyncio.run(read_bucket(*run_url))
    assert markers == {1: completion.DoneMarker(node="b", attempt=1, steps=STEPS, tokens=4 * STEPS)}
    assert finished is not None
    summary = completion.decode_summary(finished)
    assert isinstance(summary, completion.Summary), summary
    assert (summary.by, summary.slices, summary.steps) == ("b", 1, STEPS)
    assert lines("b") == [f"0 {i}" for i in range(STEPS)]
