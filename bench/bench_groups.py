"""What a group learner costs: ``step()`` on the ranks that follow, and capture/align per
fragment in a group against a single process (issue 14).

Run: ``.venv/bin/python -m bench.bench_groups [--steps 2000] [--mib 4] [--rounds 20]``

Two figures, from one run on gloo (CPU), 2 ranks:

* **step()**: a 2-rank DDP group learner (its leader also closes rounds, over
  ``memory://``: only the leader talks to the bucket) and a single-process learner of the
  same settings (``H=40, P=2``: a check every 20 steps) each run ``--steps`` steps whose
  training is a 1 ms sleep; the time of each ``step()`` call is taken on every rank:
  median, p99 and mean per step, and the mean over the check steps (where a follower
  waits for its leader's broadcast, which includes the leader's own capture or fold-in).
* **capture and align per fragment**: ``Replica.take`` (a capture) and ``Replica.apply``
  with carry (an align) of one fragment of ``--mib`` MiB (4 tensors), median over
  ``--rounds``, on a single process's adapter, a DDP group's (the capture is the leader's
  own copy; the align adds a broadcast of the fragment) and an FSDP2 group's (the capture
  all-gathers the shards, the align broadcasts and cuts the shard locally); ratios to the
  single process.
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

from gm_core.records import Alignment, FragmentPlan
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.group import Done, GroupModel, Link, follow, resolve
from gm_shell.group_session import GroupSession
from gm_shell.models import TorchModel
from gm_shell.replica import Replica

ALGORITHM = DiLoCo(sync_every=40, fragments=2, quorum=1)
OPTIONS = SessionOptions(poll_s=0.05, renew_s=1.0, compute="numpy")
STEP_S = 0.001


def checking(session: Session) -> bool:
    """Whether the next ``step()`` is a check (a group's) or reaches the barrier (a single
    process's): the steps where it does more than count."""
    if isinstance(session, GroupSession):
        return session.step_count + 1 >= session._next_check
    pacer = session._pacer
    return pacer is not None and pacer.step + 1 >= pacer.barrier


def step_times(session: Session, steps: int) -> dict[str, float]:
    """Seconds per ``step()`` call over a loop whose training is a ``STEP_S`` sleep."""
    times, checks = [], []
    for _ in range(steps):
        time.sleep(STEP_S)
        check = checking(session)
        t0 = time.perf_counter_ns()
        session.step(samples=1)
        dt = (time.perf_counter_ns() - t0) / 1e9
        times.append(dt)
        if check:
            checks.append(dt)
    ordered = sorted(times)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[int(0.99 * len(ordered))] * 1e6,
        "mean_us": statistics.mean(ordered) * 1e6,
        "check_mean_us": statistics.mean(checks) * 1e6 if checks else float("nan"),
        "checks": len(checks),
    }


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))


def big(mib: int) -> torch.nn.Module:
    torch.manual_seed(0)
    n = mib * (1 << 20) // 4 // 4
    return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for _ in range(4)])


def fragment_times(replica: Replica, rounds: int) -> dict[str, float]:
    values = replica.read(0)
    replica.overwrite_all([values])
    committed = values + 1e-3
    takes, applies = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        taken = replica.take(r, 0, keep_copy=True)
        t1 = time.perf_counter()
        replica.apply(r, 0, committed, Alignment.CARRY, 1.0)
        applies.append(time.perf_counter() - t1)
        takes.append(t1 - t0)
        replica.recycle(taken)
    return {"capture_s": statistics.median(takes), "align_s": statistics.median(applies)}


def one_fragment(adapter: TorchModel) -> Replica:
    """A replica of ``adapter`` whose plan is one fragment of every parameter."""
    return Replica(adapter, FragmentPlan(fragments=(tuple(t.name for t in adapter.schema()),)))


def rank_main(rank: int, folder: str, args: argparse.Namespace, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/pg",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )
    found: dict[str, Any] = {}
    # step(): a DDP group learner that also closes its rounds.
    ddp = torch.nn.parallel.DistributedDataParallel(tiny())
    with Session(
        ddp, algorithm=ALGORITHM, mailbox="memory://bench-groups", node="g", options=OPTIONS
    ) as session:
        found["group_step"] = step_times(session, args.steps)
    # Capture and align: DDP, then FSDP2, one fragment of --mib MiB.
    for kind in ("ddp", "fsdp2"):
        net = big(args.mib)
        if kind == "ddp":
            wrapped: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(net)
        else:
            from torch.distributed.fsdp import fully_shard

            wrapped = fully_shard(net)
        link = Link(resolve(dist.group.WORLD, wrapped))
        model = GroupModel(wrapped, None, link)
        if link.leads:
            found[f"{kind}_fragment"] = fragment_times(one_fragment(model), args.rounds)
            link.done(Done(next_check=0, round=-1, divergences=0, rank=-1))
        else:
            follow(link, model)
    results[rank] = found
    dist.destroy_process_group()


def single(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    found: dict[str, Any] = {}
    with Session(
        tiny(), algorithm=ALGORITHM, mailbox="memory://bench-single", node="s", options=OPTIONS
    ) as session:
        found["single_step"] = step_times(session, args.steps)
    net = big(args.mib)
    found["single_fragment"] = fragment_times(one_fragment(TorchModel(net)), args.rounds)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as folder:
        results = mp.Manager().dict()
        mp.spawn(rank_main, args=(folder, args, results), nprocs=2)
        leader, follower = results[0], results[1]
    alone = single(args)
    figures = {"leader": leader, "follower": follower, "single": alone}
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    base = alone["single_fragment"]
    for kind in ("ddp", "fsdp2"):
        got = leader[f"{kind}_fragment"]
        print(
            f"{kind} group / single: capture x{got['capture_s'] / base['capture_s']:.2f}, "
            f"align x{got['align_s'] / base['align_s']:.2f}"
        )
    one = alone["single_step"]
    for name, row in (("leader", leader["group_step"]), ("follower", follower["group_step"])):
        print(
            f"step() on the {name} / single process: mean x{row['mean_us'] / one['mean_us']:.2f}"
            f", median x{row['median_us'] / one['median_us']:.2f}"
        )
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
