"""One process of a group test run: a rank of a DDP or FSDP2 group learner (gloo), a
single-process learner, or the run's dedicated closer. Started by
:func:`child` (the tests fork it from the runtime harness's fork server).

``spec`` (JSON-able): ``kind`` (``ddp``, ``fsdp``, ``single`` or ``closer``), the run
``url``, the ``node`` id, ``out`` (a folder of its own), ``algorithm`` and ``options``
(:class:`DiLoCo` and :class:`SessionOptions` fields), ``steps``; for a group rank also
``rank``, ``world``, ``pg`` (the file the group meets at) and ``pg_timeout_s``; optional:
``queue`` (``units`` and ``batches`` per unit: :meth:`Session.run` over a SharedQueue of
units ``u0``, ``u1``... instead of ``steps``), ``use_run`` (:meth:`Session.run` over
``steps`` batches), ``step_sleep_s`` and ``resume`` (an Adam optimizer, saved and restored
with the session: ``result.json`` then has the step count and Adam's steps at the start).

Every rank appends one line per step it finished to ``out/trace`` (the step, or the
queue's unit and batch: so the test can kill or stop processes at a known point) and,
after the session closed, writes ``result.json`` (its losses, the commit its session left
the model at, or the exception it raised and at which step) and ``params.npz`` (every
parameter in full, by canonical name: a DTensor is all-gathered, with its group, after the
session closed); a group's leader (and a single learner) also ``frontier.npz``, the commit
its session named, read back with :func:`gm_shell.align` at once (closers sweep payloads
older than two cycles). A closer serves until ``out/stop`` appears.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, Session, SessionOptions, SharedQueue, align

LR = 0.05


def child(spec: dict[str, Any]) -> None:
    warnings.filterwarnings("ignore")
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    # A process still running this long is hung: its threads' stacks, for the failure.
    stacks = (out / "stacks").open("w")
    faulthandler.dump_traceback_later(spec.get("dump_s", 150.0), file=stacks)
    if spec["kind"] == "closer":
        serve(spec, out)
        return
    import torch
    import torch.distributed as dist

    model, _ = torch_model(0)
    trained = model
    group = spec["kind"] in ("ddp", "fsdp")
    if group:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{spec['pg']}",
            rank=spec["rank"],
            world_size=spec["world"],
            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]),
        )
        if spec["kind"] == "ddp":
            trained = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(model)
        dist.barrier()  # the ranks enter the session together (a short timeout is tested)
    # torch.optim, not SGD by hand: FSDP2's parameters learn nothing from `p -= lr * p.grad`.
    optimizer: Any = torch.optim.SGD(model.parameters(), lr=LR)
    if spec.get("resume"):  # a stateful optimizer, saved and restored with the session
        optimizer = torch.optim.Adam(model.parameters(), lr=LR / 10)
    rng = np.random.default_rng([abs(hash(spec["node"])) % 2**31, spec.get("rank", 0)])
    try:
        session = Session(
            trained,
            algorithm=DiLoCo(**spec["algorithm"]),
            mailbox=spec["url"],
            node=spec["node"],
            role="learner",
            options=SessionOptions(**spec["options"]),
            run_key=None,
            resume={"optimizer": optimizer} if spec.get("resume") else None,
        )
    except ValueError as error:  # refused as made (on every rank alike): no session
        refused = {"error": "ValueError", "message": str(error)}
        (out / "result.json").write_text(json.dumps(refused))
        return
    losses: list[float] = []
    outcome: dict[str, Any] = {"error": None}
    trace = (out / "trace").open("a", buffering=1)

    def train(batch: Any) -> int:
        x = rng.normal(size=(16, IN)).astype(np.float32)
        loss = ((trained(torch.from_numpy(x)) - torch.from_numpy(x @ TEACHER)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        trace.write(f"{batch}\n")  # the step, or a queue's unit and batch
        time.sleep(spec.get("step_sleep_s", 0.0))
        return 16

    try:
        if "queue" in spec:  # Session.run over a SharedQueue of the run's nodes
            units, batches = spec["queue"]["units"], spec["queue"]["batches"]
            queue = SharedQueue(
                [f"u{i}" for i in range(units)], lambda u: (f"{u} {b}" for b in range(batches))
            )
            session.start()
            session.run(train, queue)
        elif spec.get("use_run"):  # Session.run: a done marker and a look for the run's end
            session.start()
            session.run(train, range(spec["steps"]))
        else:
            with session:
                # Where this rank starts: its step count and its optimizer's (Adam's) steps.
                outcome["start_step"] = session.step_count
                counts = {float(s["step"]) for s in optimizer.state.values() if "step" in s}
                outcome["optimizer_steps"] = sorted(counts)
                for step in range(spec["steps"]):
                    session.step(samples=train(step))
                outcome["step_count"] = session.step_count
    except Exception as error:
        failure = {"error": type(error).__name__, "message": str(error)[:500], "at": len(losses)}
        outcome.update(failure)
    checkpoint = session.checkpoint
    outcome.update(
        holders=_gm_holders_of_the_group(),
        losses=losses,
        round=None if checkpoint is None else checkpoint.round,
        leads=getattr(session, "leads", True),
    )
    if outcome["error"] is None:
        with torch.no_grad():
            full = {
                n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy()
                for n, p in model.named_parameters()
            }
        np.savez(out / "params.npz", **full)
        if outcome["leads"]:  # the commit the group was left at, read back while it is kept
            fresh, _ = torch_model(1)
            align(fresh, mailbox=spec["url"], round=outcome["round"], run_key=None)
            frontier = {n: p.detach().numpy() for n, p in fresh.named_parameters()}
            np.savez(out / "frontier.npz", **frontier)
    (out / "result.json").write_text(json.dumps(outcome))
    # Leave at once, past Python's teardown of the model, the session and the group: a DDP
    # follower whose leader had exited hung there once (after its result; 1 run in ~10 at
    # load 12), in torch's destructors, not in gm's code, past the test's wait.
    os._exit(0)


def serve(spec: dict[str, Any], out: Path) -> None:
    session = Session(
        algorithm=DiLoCo(**spec["algorithm"]),
        mailbox=spec["url"],
        node=spec["node"],
        role="closer",
        options=SessionOptions(**spec["options"]),
        run_key=None,
    )
    with session:
        while not (out / "stop").exists():
            session.serve(duration_s=0.2)
    (out / "result.json").write_text(json.dumps({"error": None}))


def _gm_holders_of_the_group() -> list[str]:
    """gm's objects that still refer to the process group once the session is closed: none
    may, or the group outlives the user's ``destroy_process_group`` until the garbage
    collector reaches the session, at interpreter exit if need be, where gloo's backend
    aborts the process as it is destroyed."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return []
    referrers = gc.get_referrers(dist.group.WORLD)
    return [type(r).__qualname__ for r in referrers if type(r).__module__.startswith("gm_")]
