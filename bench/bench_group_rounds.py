"""Capture+publish and align per fragment over a real mailbox: a DDP group, an FSDP2 group
and a single process side by side (issue 14), and ``step()`` on a group's follower rank.

Run: ``.venv/bin/python -m bench.bench_group_rounds [--mib 4] [--rounds 12] [--repeat 2]``

Each *case* is one real run in a fresh ``file://`` folder, with real processes: a closer
(``Session(role="closer")``) and one learner, either a single process or a 2-rank gloo
group (DDP, or FSDP2 ``fully_shard``), whose model is 2 fragments of ``--mib`` MiB (4 fp32
tensors each; ``H=8, P=2``: a round every 4 steps, ``in_flight=2``, quorum 1, wire formats
at their defaults). A training step is a ``--step-ms`` sleep and a small change to every
parameter (so every delta is new). The cases alternate (single, ddp, fsdp2, single, ...)
``--repeat`` times, so load drift falls on all three alike.

Measured on the learner's leader (the one process of it that talks to the bucket), per
fragment, median over the rounds of every repeat (the first two rounds left out):

* **capture**: ``Replica.take`` or ``take_planned`` inside the due ``step()`` (the
  training thread's copy of the fragment; for FSDP2 it all-gathers the shards, every rank
  taking part);
* **publish**: from the capture's end to the :class:`~gm_shell.events.Published` event
  (hand-off to the loop, delta, encode, the payload's and the snapshot's PUTs);
* **capture+publish**: the two in a row, what a round costs before the closer sees it;
* **align**: ``Replica.apply`` of a commit inside ``step()`` (a group adds the fragment's
  broadcast; FSDP2 then cuts each rank's shard locally).

And ``step()``: the time of every call on the follower rank (rank 1) and on the single
process (median, mean). Printed: the medians and the ratios of each group to the single
process of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.events import Event, Published
from gm_shell.replica import Replica

ALGORITHM = DiLoCo(sync_every=8, fragments=2, quorum=1, in_flight=2)
OPTIONS = SessionOptions(poll_s=0.02, renew_s=1.0, compute="numpy", join_timeout_s=120.0)
KINDS = ("single", "ddp", "fsdp2")
SKIP = 2
"""Rounds left out at the start of a case (first payloads, cold caches)."""


def model(mib: int) -> torch.nn.Module:
    """Two fragments of ``mib`` MiB: 8 fp32 tensors of ``mib / 4`` MiB each."""
    torch.manual_seed(0)
    n = mib * (1 << 20) // 4 // 4
    return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for _ in range(8)])


class Clock:
    """Times the leader's captures and aligns (its replica's ``take`` and ``apply``) and
    the Published events."""

    def __init__(self) -> None:
        self.captures: dict[int, tuple[float, float]] = {}
        self.aligns: list[float] = []
        self.published: dict[int, float] = {}

    def hook(self, replica: Replica) -> None:
        """Times ``take`` (a capture the loop did not plan) and ``take_planned`` (one it
        prepared a buffer for: most of them; a due step's captures share its times)."""
        take, take_planned, apply = replica.take, replica.take_planned, replica.apply

        def timed_take(round_: int, fragment: int, keep_copy: bool) -> Any:
            t0 = time.monotonic()
            taken = take(round_, fragment, keep_copy)
            self.captures[round_] = (t0, time.monotonic())
            return taken

        def timed_take_planned(prepared: Any, keep_copy: bool) -> Any:
            t0 = time.monotonic()
            taken = take_planned(prepared, keep_copy)
            t1 = time.monotonic()
            self.captures.update((t.round, (t0, t1)) for t in taken)
            return taken

        def timed_apply(*args: Any) -> None:
            t0 = time.monotonic()
            apply(*args)
            self.aligns.append(time.monotonic() - t0)

        replica.take = timed_take  # type: ignore[method-assign]
        replica.take_planned = timed_take_planned  # type: ignore[method-assign]
        replica.apply = timed_apply  # type: ignore[method-assign,assignment]

    def event(self, event: Event) -> None:
        if isinstance(event, Published):
            self.published[event.round] = event.at_s  # the loop's clock: time.monotonic

    def figures(self) -> dict[str, list[float]]:
        rounds = sorted(r for r in self.captures if r in self.published)[SKIP:]
        capture = [self.captures[r][1] - self.captures[r][0] for r in rounds]
        publish = [self.published[r] - self.captures[r][1] for r in rounds]
        return {
            "capture_s": capture,
            "publish_s": publish,
            "capture_publish_s": [a + b for a, b in zip(capture, publish, strict=True)],
            "align_s": self.aligns[SKIP:],
        }


def learner(rank: int, kind: str, world: int, url: str, folder: str, args: Any) -> None:
    """One process of the learner (rank ``rank`` of ``world``); writes its figures."""
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{folder}/pg",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=300),
        )
    net = model(args.mib)
    trained: Any = net
    if kind == "ddp":
        trained = torch.nn.parallel.DistributedDataParallel(net)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        trained = fully_shard(net)
    clock = Clock()
    session = Session(
        trained,
        algorithm=ALGORITHM,
        mailbox=url,
        node=kind,
        role="learner",
        options=OPTIONS,
        callbacks=[clock.event],
        run_key=None,
    )
    steps: list[float] = []
    with session:
        if getattr(session, "leads", True):
            assert session._replica is not None
            clock.hook(session._replica)
        for _ in range((args.rounds + SKIP) * 4 + 4):  # a round every 4 steps, one to spare
            time.sleep(args.step_ms / 1000)
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(1e-4)  # a DTensor adds to its own shard
            t0 = time.perf_counter()
            session.step(samples=1)
            steps.append(time.perf_counter() - t0)
    found = {"step_s": steps, **clock.figures()} if rank == 0 else {"step_s": steps}
    Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
    if world > 1:
        dist.destroy_process_group()


def closer(url: str, folder: str) -> None:
    session = Session(
        algorithm=ALGORITHM,
        mailbox=url,
        node="closer",
        role="closer",
        options=OPTIONS,
        run_key=None,
    )
    with session:
        while not Path(folder, "stop").exists():
            session.serve(duration_s=0.2)


def case(kind: str, root: str, index: int, args: Any) -> dict[int, Any]:
    """One run: a closer and the learner ``kind``; the learner's ranks' figures."""
    folder = Path(root, f"{kind}-{index}")
    folder.mkdir()
    url = f"file://{folder / 'bucket'}"
    spawn = mp.get_context("spawn")
    serving = spawn.Process(target=closer, args=(url, str(folder)))
    serving.start()
    world = 1 if kind == "single" else 2
    mp.spawn(learner, args=(kind, world, url, str(folder), args), nprocs=world)  # type: ignore[attr-defined,no-untyped-call]
    (folder / "stop").write_text("stop")
    serving.join(120)
    return {r: json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)}


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=4, help="MiB per fragment")
    parser.add_argument("--rounds", type=int, default=12, help="rounds measured per case")
    parser.add_argument("--repeat", type=int, default=2, help="times each case runs, in turn")
    parser.add_argument("--step-ms", type=float, default=20.0, help="a training step's sleep")
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}")
    pooled: dict[str, dict[int, dict[str, list[float]]]] = {kind: {} for kind in KINDS}
    with tempfile.TemporaryDirectory() as root:
        for index in range(args.repeat):
            for kind in KINDS:
                for rank, found in case(kind, root, index, args).items():
                    into = pooled[kind].setdefault(rank, {})
                    for name, values in found.items():
                        into.setdefault(name, []).extend(values)
    if args.json:
        Path(args.json).write_text(json.dumps(pooled))
    report(pooled)
    print(f"load {os.getloadavg()[0]:.1f}")


def report(pooled: dict[str, dict[int, dict[str, list[float]]]]) -> None:
    names = ("capture_s", "publish_s", "capture_publish_s", "align_s")
    single = pooled["single"][0]
    print("per fragment, median ms (x the single process's)")
    print(f"{'learner':8s} " + " ".join(f"{n[:-2]:>22s}" for n in names))
    for kind in KINDS:
        leader = pooled[kind][0]
        cells = []
        for name in names:
            got, base = median_ms(leader[name]), median_ms(single[name])
            cells.append(f"{got:9.2f} (x{got / base:5.2f}) n={len(leader[name]):<3d}")
        print(f"{kind:8s} " + " ".join(cells))
    rows: list[tuple[str, list[float]]] = [("single", single["step_s"])]
    rows += [(f"{k} rank 1", pooled[k][1]["step_s"]) for k in ("ddp", "fsdp2")]
    print("step() per call: median us, mean us (median x the single process's)")
    for name, values in rows:
        ratio = statistics.median(values) / statistics.median(single["step_s"])
        print(
            f"  {name:12s} {statistics.median(values) * 1e6:9.1f} "
            f"{statistics.mean(values) * 1e6:10.1f} (x{ratio:.2f})"
        )


if __name__ == "__main__":
    main()
