"""Group learners (issue 14): torch.distributed groups of 2 ranks on gloo, as real processes.

One run on ``file://``: a DDP group, an FSDP2 group (``fully_shard``), a single-process
learner and a dedicated closer. Every rank's parameters equal the commit its session left
them at, bit for bit; losses go down. Then the failures a group must survive without a
collective left alone: a closer stopped (SIGSTOP) past the group's collective timeout, a
stall past the session's timeout (every rank raises the same error at the same step),
and a rank killed (kill -9): its group leaves, the run goes on.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from group_worker import child
from procs import Deadline, traced
from runtime_bucket import open_tape, read_bucket
from runtime_harness import FORKS, file_run
from runtime_worker import IN, TEACHER, torch_model

from gm_core import keys
from gm_shell.models import adapt
from gm_shell.stores import MailboxOptions

ALGORITHM = {
    "sync_every": 8,
    "fragments": 2,
    "quorum": 1,
    "in_flight": 1,
    "lease_timeout_s": 3.0,
    "takeover_floor_s": 3.0,
    # Plain averaging: with the default Nesterov momentum (0.9) the commits of a 40-step run
    # still swing (held-out loss 5-20 at the end from 17), which says nothing about groups.
    "outer_lr": 1.0,
    "outer_momentum": 0.0,
}
OPTIONS = {
    "poll_s": 0.05,
    "renew_s": 0.4,
    "close_timeout_s": 20.0,
    "stall_timeout_s": 60.0,
    "join_timeout_s": 60.0,
    "compute": "numpy",
}
PG_TIMEOUT_S = 60.0
"""The groups' collective timeout, but where a test makes it short."""
SHORT_PG_TIMEOUT_S = 8.0
"""A collective timeout shorter than the closer's stop in the stall test, so a follower
left alone in a collective while its leader waits would fail."""


class Run:
    """The processes of one run, by name."""

    def __init__(self, tmp_path: Path) -> None:
        self.url, _ = file_run(tmp_path)
        self.bucket = tmp_path / "bucket"
        self.dir = tmp_path
        self.procs: dict[str, Any] = {}

    def start(self, name: str, kind: str, **extra: Any) -> None:
        spec = {
            "kind": kind,
            "url": self.url,
            "out": str(self.dir / name),
            "algorithm": ALGORITHM,
            "options": {**OPTIONS, **extra.pop("options", {})},
            "steps": 40,
            "pg_timeout_s": PG_TIMEOUT_S,
            **extra,
        }
        process = FORKS.Process(target=child, args=(spec,), name=name)
        process.start()
        self.procs[name] = process

    def group(self, node: str, kind: str, *, name: str | None = None, **extra: Any) -> None:
        """Node ``node``'s 2 ranks, processes ``{name}.0`` and ``{name}.1`` (name: the node)."""
        name = name or node
        for rank in range(2):
            pg = str(self.dir / f"{name}.pg")
            self.start(f"{name}.{rank}", kind, node=node, rank=rank, world=2, pg=pg, **extra)

    def steps(self, name: str) -> int:
        return len(traced(self.dir / name / "trace"))

    def result(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.dir / name / "result.json").read_text())
        return found

    def params(self, name: str, which: str = "params") -> dict[str, np.ndarray]:
        with np.load(self.dir / name / f"{which}.npz") as data:
            return {k: data[k] for k in data.files}

    def signal(self, name: str, sig: signal.Signals) -> None:
        pid = self.procs[name].pid
        assert pid is not None
        os.kill(pid, sig)

    def join(self, *names: str, timeout_s: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout_s
        for name in names:
            self.procs[name].join(max(deadline - time.monotonic(), 0.1))
        return {name: self.procs[name].exitcode for name in names}

    def close(self) -> None:
        for process in self.procs.values():
            if process.is_alive():
                assert process.pid is not None
                os.kill(process.pid, signal.SIGCONT)
                os.kill(process.pid, signal.SIGKILL)
                process.join(10)

    def lease_exists(self, node: str) -> bool:
        return (self.bucket / keys.lease(node)).exists()


def held_out_loss(params: dict[str, np.ndarray] | None) -> float:
    """The regression loss on fixed data of the initial model, or with ``params``."""
    import torch

    model, _ = torch_model(0)
    if params is not None:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    x = np.random.default_rng(99).normal(size=(256, IN)).astype(np.float32)
    with torch.no_grad():
        return float(((model(torch.from_numpy(x)) - torch.from_numpy(x @ TEACHER)) ** 2).mean())


@pytest.fixture
def run(tmp_path: Path) -> Any:
    made = Run(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_groups_and_a_single_learner_share_a_run_bit_for_bit(run: Run) -> None:
    run.start("closer", "closer", node="closer")
    run.group("ddp", "ddp", use_run=True)  # Session.run on both ranks
    run.group("fsdp", "fsdp")
    run.start("single", "single", node="single")
    learners = ["ddp.0", "ddp.1", "fsdp.0", "fsdp.1", "single"]
    codes = run.join(*learners, timeout_s=240)
    (run.dir / "closer" / "stop").write_text("stop")
    codes.update(run.join("closer", timeout_s=60))
    assert codes == dict.fromkeys(codes, 0), codes
    for name in learners:
        result = run.result(name)
        assert result["error"] is None, (name, result)
        assert result["holders"] == [], (name, result["holders"])  # the group is the user's
        assert len(result["losses"]) == 40
        first, last = np.mean(result["losses"][:5]), np.mean(result["losses"][-10:])
        assert last < first, (name, first, last)
        # The model as the session left it: the commit it names, bit for bit, on every rank.
        frontier = run.params(name.split(".")[0] + (".0" if "." in name else ""), "frontier")
        params = run.params(name)
        assert params.keys() == frontier.keys()
        for key, values in frontier.items():
            assert np.array_equal(params[key], values), (name, key)
    # The commits learn: held-out loss of the model each session was left at vs the start.
    for name in ("ddp.0", "fsdp.0", "single"):
        start, end = held_out_loss(None), held_out_loss(run.params(name, "frontier"))
        assert end < start / 10, (name, start, end)
    for node in ("ddp", "fsdp"):
        assert run.result(f"{node}.0")["round"] == run.result(f"{node}.1")["round"]
        assert run.result(f"{node}.1")["leads"] is False
    assert (run.bucket / keys.done("ddp")).exists()  # run() marked the group's data done
    # Every node took part: the groups published under their leader's node id.
    participants = _participants(run.url)
    assert {"ddp", "fsdp", "single"} <= participants, participants


def _participants(url: str) -> set[str]:
    tape = open_tape(read_bucket(url, MailboxOptions()))
    return {p.learner for record in tape for p in record.participants}


def test_a_group_survives_a_stopped_closer_and_fails_as_one_past_its_stall_timeout(
    run: Run,
) -> None:
    run.start("closer", "closer", node="closer")
    short = SHORT_PG_TIMEOUT_S
    run.group("ddp", "ddp", steps=60, pg_timeout_s=short)
    run.group("fsdp", "fsdp", steps=60, pg_timeout_s=short, options={"stall_timeout_s": 2 * short})
    names = ["ddp.0", "ddp.1", "fsdp.0", "fsdp.1"]
    deadline = Deadline(120)
    deadline.wait("groups training", lambda: all(run.steps(n) >= 10 for n in names))
    run.signal("closer", signal.SIGSTOP)
    time.sleep(3 * short)  # past both the collectives' timeout and the fsdp stall timeout
    run.signal("closer", signal.SIGCONT)
    codes = run.join(*names, timeout_s=120)
    (run.dir / "closer" / "stop").write_text("stop")
    run.join("closer", timeout_s=60)
    assert codes == dict.fromkeys(codes, 0), codes
    # The DDP group waited for the closer, its ranks alive in the leader's heartbeats.
    for name in ("ddp.0", "ddp.1"):
        result = run.result(name)
        assert result["error"] is None, (name, result)
        assert len(result["losses"]) == 60
    assert run.result("ddp.0")["round"] == run.result("ddp.1")["round"]
    # The FSDP group gave up as one: the same error at the same step on both ranks.
    stalled = [run.result(n) for n in ("fsdp.0", "fsdp.1")]
    assert [r["error"] for r in stalled] == ["StalledError", "StalledError"], stalled
    assert stalled[0]["at"] == stalled[1]["at"] < 60, stalled
    assert not run.lease_exists("fsdp")


def test_a_killed_rank_makes_its_group_leave_and_the_run_goes_on(run: Run) -> None:
    run.start("closer", "closer", node="closer")
    run.group("ddp", "ddp", steps=400)
    run.group("fsdp", "fsdp", steps=400)
    run.start("single", "single", node="single", steps=120)
    deadline = Deadline(120)
    names = ["ddp.0", "ddp.1", "fsdp.0", "fsdp.1"]
    deadline.wait("groups training", lambda: all(run.steps(n) >= 12 for n in names))
    run.signal("ddp.1", signal.SIGKILL)  # a follower dies: the leader must leave
    run.signal("fsdp.0", signal.SIGKILL)  # a leader dies: its follower must not hang
    codes = run.join("ddp.0", "fsdp.1", timeout_s=60)
    assert codes == {"ddp.0": 0, "fsdp.1": 0}, codes  # each noticed, and exited
    assert run.result("ddp.0")["error"] is not None
    assert run.result("fsdp.1")["error"] is not None
    assert not run.lease_exists("ddp")  # left: its lease deleted at once
    rounds_then = len(open_tape(read_bucket(run.url, MailboxOptions())))
    assert run.join("single", timeout_s=120) == {"single": 0}
    (run.dir / "closer" / "stop").write_text("stop")
    assert run.join("closer", timeout_s=60) == {"closer": 0}
    single = run.result("single")
    assert single["error"] is None, single
    assert len(single["losses"]) == 120
    assert len(open_tape(read_bucket(run.url, MailboxOptions()))) > rounds_then  # the run went on


def test_a_group_trains_the_units_of_a_shared_queue_it_claims_as_one_node(run: Run) -> None:
    """Session.run over a SharedQueue: the group's leader claims units and names each to
    its follower, both ranks train every batch of the same units in the same order; with
    a single learner on the same queue every unit is done, each by the node that held it."""
    queue = {"units": 6, "batches": 8}
    run.start("closer", "closer", node="closer")
    run.group("ddp", "ddp", queue=queue, step_sleep_s=0.05)
    Deadline(120).wait("the group training", lambda: run.steps("ddp.0") >= 1)
    run.start("single", "single", node="single", queue=queue, step_sleep_s=0.05)
    learners = ["ddp.0", "ddp.1", "single"]
    codes = run.join(*learners, timeout_s=240)
    (run.dir / "closer" / "stop").write_text("stop")
    codes.update(run.join("closer", timeout_s=60))
    assert codes == dict.fromkeys(codes, 0), codes
    for name in learners:
        assert run.result(name)["error"] is None, (name, run.result(name))
    lines = {name: traced(run.dir / name / "trace") for name in learners}
    assert lines["ddp.0"] == lines["ddp.1"]  # the same units, batches and order on both ranks
    units = {name: {line.split()[0] for line in lines[name]} for name in ("ddp.0", "single")}
    assert units["ddp.0"], units  # it trained before the single learner started
    for name, trained in units.items():  # each unit it trained, to its end
        assert len(lines[name]) == 8 * len(trained), (name, lines[name])
    assert units["ddp.0"] | units["single"] == {f"u{i}" for i in range(6)}, units
    for i in range(6):
        assert list((run.bucket / f"queue/queue/units/u{i}/done").iterdir()), i


def test_a_ddp_group_started_again_with_resume_goes_on_from_its_step_on_every_rank(
    run: Run,
) -> None:
    """resume= with a DDP group: the leader saves the group's state on closing; started
    again (new processes, same node), every rank counts on from the saved step and its
    Adam optimizer holds the saved state (its step count), not a fresh one. An FSDP2
    group is refused resume= by name on both ranks."""
    run.start("closer", "closer", node="closer")
    run.group("ddp", "ddp", steps=12, resume=True)
    run.group("fsdp", "fsdp", steps=4, resume=True)
    first, sharded = ["ddp.0", "ddp.1"], ["fsdp.0", "fsdp.1"]
    assert run.join(*first, *sharded, timeout_s=180) == dict.fromkeys(first + sharded, 0)
    for name in sharded:
        assert run.result(name)["error"] == "ValueError", run.result(name)
        assert "sharded parameters (FSDP2)" in run.result(name)["message"]
    run.group("ddp", "ddp", name="again", steps=8, resume=True)
    again = ["again.0", "again.1"]
    codes = run.join(*again, timeout_s=180)
    (run.dir / "closer" / "stop").write_text("stop")
    assert codes == dict.fromkeys(again, 0), codes
    for name in first:
        result = run.result(name)
        assert result["error"] is None, (name, result)
        assert (result["start_step"], result["optimizer_steps"]) == (0, []), (name, result)
        assert result["step_count"] == 12, (name, result)
    for name in again:
        result = run.result(name)
        assert result["error"] is None, (name, result)
        assert (result["start_step"], result["optimizer_steps"]) == (12, [12.0]), (name, result)
        assert result["step_count"] == 20, (name, result)


def test_a_single_process_sees_no_group_without_torch_distributed() -> None:
    from gm_shell.group import AUTO, resolve

    model, _ = torch_model(0)
    assert resolve(AUTO, model) is None
    assert resolve(None, model) is None
    assert type(adapt(model)).__name__ == "TorchModel"


def test_a_leaders_exception_reaches_its_followers_as_the_same_class() -> None:
    from gm_shell import RankLost, StalledError
    from gm_shell.group import GroupLeaderError, _failure, _rebuild
    from gm_shell.session import DivergedError

    lost = _rebuild(*_failure(RankLost("g", 3, 2)))
    assert isinstance(lost, RankLost)
    assert (lost.node, lost.rank, lost.attempt) == ("g", 3, 2)
    for error in (StalledError("no commit for 60 s"), DivergedError("3 in a row")):
        rebuilt = _rebuild(*_failure(error))
        assert type(rebuilt) is type(error)
        assert str(rebuilt) == str(error)
    other = _rebuild(*_failure(KeyError("fc1.weight")))
    assert isinstance(other, GroupLeaderError)
    assert "KeyError" in str(other)
    assert "fc1.weight" in str(other)
