"""``Session(ranks=N)`` across processes: a rank holder paused (SIGSTOP) past the lease
timeout loses its rank to a waiting peer — the newest claim wins — and, once it runs
again, gets ``RankLost`` from ``step()`` at its next watch; the peer trains the slice to
its end, writes the rank's only done marker and finds the run finished. On a local folder
and on SeaweedFS."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
from procs import Deadline, result, spawn, traced

from gm_core import auth, completion, keys, ranks
from gm_shell import MailboxOptions
from gm_shell.mailbox import Mailbox

STEPS = 40


def start(
    run: tuple[str, MailboxOptions], node: str, trace: Path, steps: int, step_s: float
) -> subprocess.Popen[str]:
    url, options = run
    spec = {"url": url, "node": node, "ranks": 1, "steps": steps, "step_s": step_s}
    spec |= {"trace": str(trace), "mailbox": attrs.asdict(options)}
    return spawn("rank_worker.py", spec)


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
    deadline = Deadline(150)

    def lines(node: str) -> list[str]:
        return traced(traces[node])

    try:
        deadline.wait("a never trained", lambda: bool(lines("a")), alive=[holder])
        peer = start(run_url, "b", traces["b"], steps=STEPS, step_s=0.02)
        # b waits in start() while a holds the only rank live; paused, a's lease stops
        # changing, and after the lease timeout on b's clock b claims the rank over it.
        holder.send_signal(signal.SIGSTOP)
        try:
            deadline.wait("b never took the rank over", lambda: bool(lines("b")), alive=[peer])
        finally:
            holder.send_signal(signal.SIGCONT)
        assert result("a", holder, timeout_s=120) == {"lost": 0, "attempt": 0, "node": "a"}
        assert result("b", peer, timeout_s=120) == {"rank": 0, "finished": True}
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
