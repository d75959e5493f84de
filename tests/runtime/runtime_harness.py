"""Real multi-process runs for the runtime tests: spawn, kill, hang and resume nodes.

Each node runs :func:`runtime_worker.child` in its own OS process, pointed at one
run URL (a local folder or a bucket on a SeaweedFS server the fixtures started).
Processes are forked from a fork server that imported torch and gm_shell once:
importing them costs seconds of CPU per process here, which dominated every scenario; a forked
child is as real a process as any (its own pid, memory, threads and sockets, and
kill -9 / SIGSTOP act on it alone). The harness only does what an operator
could: start processes, send them signals, drop a stop file, read their results
and the events they logged. Judging the run happens from the bucket (see
:mod:`runtime_bucket`).
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import runtime_worker

from gm_shell.stores import MailboxOptions

FORKS = multiprocessing.get_context("forkserver")
# Only installed packages: Python 3.11's fork server imports its preloads on the
# interpreter's own sys.path (it ignores the parent's), where this folder's modules are not
# found (a failed preload is skipped in silence: runtime_worker here was, and every child
# imported gm_shell, 1.5 s of CPU, again). torch._dynamo: the first torch.optim optimizer
# (and DDP) of a process imports it, 4-6 s of CPU here, which every group rank paid.
FORKS.set_forkserver_preload(["torch", "torch._dynamo", "gm_shell"])

FAST = {
    "poll_s": 0.1,
    "renew_s": 0.4,
    "close_timeout_s": 8.0,
    "stall_timeout_s": 90.0,
    "join_timeout_s": 60.0,
    "compute": "numpy",
}
"""Node options sized for seconds-long test runs."""


@attrs.define
class Node:
    name: str
    spec: dict[str, Any]
    process: multiprocessing.process.BaseProcess
    out: Path

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def wait(self, timeout_s: float) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running."""
        self.process.join(timeout_s)
        return self.process.exitcode


@attrs.define
class Harness:
    url: str
    workdir: Path
    algorithm: dict[str, Any]
    mailbox: MailboxOptions = attrs.field(factory=MailboxOptions)
    options: dict[str, Any] = attrs.field(factory=lambda: dict(FAST))
    nodes: dict[str, Node] = attrs.field(factory=dict)
    incarnations: dict[str, int] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        _OPEN.append(self)

    def spawn(
        self, name: str, *, role: str = "both", seed: int | None = None, **extra: Any
    ) -> Node:
        """Start (or restart) node ``name``; its outputs go to a fresh folder per incarnation."""
        n = self.incarnations.get(name, 0) + 1
        self.incarnations[name] = n
        out = self.workdir / f"{name}.{n}"
        spec = {
            "url": self.url,
            "node": name,
            "role": role,
            "seed": seed if seed is not None else 100 + len(self.incarnations),
            "algorithm": self.algorithm,
            "options": self.options,
            "mailbox": attrs.asdict(self.mailbox),
            "out": str(out),
            "stop_file": str(self.workdir / f"{name}.stop"),
            "step_sleep_s": 0.02,
            **extra,
        }
        (self.workdir / f"{name}.stop").unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        process = FORKS.Process(target=runtime_worker.child, args=(spec,), name=name)
        process.start()
        node = Node(name=name, spec=spec, process=process, out=out)
        self.nodes[name] = node
        return node

    def signal(self, name: str, sig: signal.Signals) -> None:
        node = self.nodes[name]
        if node.alive:
            os.kill(node.pid, sig)

    def kill(self, name: str) -> None:
        """kill -9: the process vanishes mid-whatever; nothing is cleaned up."""
        self.signal(name, signal.SIGKILL)
        self.nodes[name].wait(10)

    def stop(self, *names: str, timeout_s: float = 60.0) -> dict[str, int]:
        """Ask nodes to finish (stop file), and wait for them to close and exit."""
        for name in names:
            (self.workdir / f"{name}.stop").write_text("stop")
        codes = {}
        deadline = time.monotonic() + timeout_s
        for name in names:
            node = self.nodes[name]
            code = node.wait(max(deadline - time.monotonic(), 0.1))
            if code is None:
                os.kill(node.pid, signal.SIGUSR1)  # the worker dumps its machines' states
                time.sleep(1.0)
                os.kill(node.pid, signal.SIGKILL)
                code = node.wait(10)
            assert code is not None
            codes[name] = code
        return codes

    def close(self) -> None:
        """Whatever is still running dies (resumed first, so SIGKILL is not queued behind STOP)."""
        if self in _OPEN:
            _OPEN.remove(self)
        for node in self.nodes.values():
            if node.alive:
                os.kill(node.pid, signal.SIGCONT)
                os.kill(node.pid, signal.SIGKILL)
                node.wait(10)

    def events(self, name: str) -> list[dict[str, str]]:
        path = self.nodes[name].out / "events.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def all_events(self) -> list[dict[str, str]]:
        found = []
        for path in sorted(self.workdir.glob("*/events.jsonl")):
            lines = path.read_text().splitlines()
            found.extend(json.loads(line) for line in lines if line.endswith("}"))
        return found

    def written(self) -> dict[str, bytes]:
        """Every snapshot the nodes created, by key (``written.jsonl``, :mod:`runtime_worker`):
        what each node wrote, even where the run swept it before anyone looked."""
        found = {}
        for path in sorted(self.workdir.glob("*/written.jsonl")):
            lines = path.read_text().splitlines()
            for line in lines:
                if line.endswith("}"):  # a node killed mid-line leaves a stub
                    doc = json.loads(line)
                    found[doc["key"]] = base64.b64decode(doc["data"])
        return found

    def result(self, name: str) -> dict[str, Any]:
        node = self.nodes[name]
        path = node.out / "result.json"
        if not path.exists():
            log = (node.out / "stderr.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{name} left no result (exit {node.process.exitcode}):\n{log}")
        result: dict[str, Any] = json.loads(path.read_text())
        with np.load(node.out / "params.npz") as params:
            result["params"] = [params[f"f{i}"] for i in range(len(params.files))]
        return result

    def log(self, name: str) -> str:
        return (self.nodes[name].out / "stderr.log").read_text(errors="replace")

    def report(self, events: int = 8, lines: int = 8) -> str:
        """Each node's state, the counts of its event kinds, its last events and log lines:
        what a timed-out wait shows, so that a CI failure can be read without the run."""
        parts = []
        for name, node in self.nodes.items():
            seen = self.events(name)
            kinds: dict[str, int] = {}
            for event in seen:
                kinds[event["event"]] = kinds.get(event["event"], 0) + 1
            state = "running" if node.alive else f"exit {node.process.exitcode}"
            parts.append(f"--- {name} ({state}): {kinds}")
            parts.extend(
                f"  {e['event']} r{e['round']} {e.get('detail', '')[:160]}" for e in seen[-events:]
            )
            log = node.out / "stderr.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.extend(f"  | {line[:200]}" for line in tail)
        return "\n".join(parts)


_OPEN: list[Harness] = []
"""The harnesses not yet closed (one test at a time per process): a timed-out
:func:`wait_until` appends their reports to its message."""


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            reports = "".join(f"\n{harness.report()}" for harness in _OPEN)
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{reports}")
        time.sleep(every_s)


TEST_MAILBOX = MailboxOptions(backoff_base_s=0.02, backoff_cap_s=0.5, seed=0)


def file_run(tmp_path: Path) -> tuple[str, MailboxOptions]:
    return f"file://{tmp_path / 'bucket'}", TEST_MAILBOX


def s3_run(server: Any) -> tuple[str, MailboxOptions]:
    """A fresh run prefix in the test bucket of a running S3 server."""
    return f"{server.url}/run-{uuid.uuid4().hex[:10]}", server.options


def make_harness(url: str, options: MailboxOptions, workdir: Path, **algorithm: Any) -> Harness:
    """A run with seconds-long rounds: 16 steps per cycle, 2 fragments, 2 s lease timeout."""
    defaults: dict[str, Any] = {
        "sync_every": 16,
        "fragments": 2,
        "quorum": 1,
        "in_flight": 2,
        "lease_timeout_s": 2.0,
        "takeover_floor_s": 3.0,
    }
    return Harness(url=url, workdir=workdir, algorithm={**defaults, **algorithm}, mailbox=options)
