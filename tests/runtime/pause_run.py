"""Two learners on threads, one of which pauses mid-run: the tape's estimates around it.

Shared by ``test_pause.py`` (a pause of seconds) and ``bench/bench_pause.py`` (40 s).
Each learner trains the runtime tests' small regression model at ``step_s`` per step
(a sleep stands in for the work); learner ``a`` stops for ``pause_s`` after
``pause_at`` steps, inside ``Session.pause()`` when ``declared``. The result is every
round record, read back from the ``file://`` bucket.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_core import codec, schedule, timing
from gm_core.records import RoundRecord
from gm_shell import DiLoCo, Session, SessionOptions

OPTIONS = SessionOptions(
    poll_s=0.02, renew_s=0.5, close_timeout_s=10.0, stall_timeout_s=120.0, join_timeout_s=60.0
)


def run(
    bucket: Path,
    *,
    steps: int,
    step_s: float,
    pause_at: int,
    pause_s: float,
    declared: bool,
    sync_every: int = 20,
) -> list[RoundRecord]:
    url = f"file://{bucket}"
    algorithm = algorithm_of(sync_every)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)
    done = threading.Event()

    def node(name: str, seed: int) -> None:
        try:
            model, train = torch_model(seed)
            rng = np.random.default_rng(seed)
            with Session(model, algorithm=algorithm, mailbox=url, node=name, options=OPTIONS) as s:
                barrier.wait(timeout=60)
                step = 0
                while (step < steps) if name == "a" else not done.is_set():
                    if name == "a" and step == pause_at:
                        pause(s, pause_s, declared)
                    x = rng.normal(size=(32, IN)).astype(np.float32)
                    train(x, x @ TEACHER)
                    time.sleep(step_s)
                    s.step(samples=32)
                    step += 1
                done.set()  # b trains as long as a does, pause included
                barrier.wait(timeout=120)
        except BaseException as error:
            errors.append(error)
            done.set()
            barrier.abort()

    threads = [threading.Thread(target=node, args=(n, i)) for i, n in enumerate("ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    paths = sorted((bucket / "rounds").glob("*.json"))
    return [codec.decode(RoundRecord, p.read_bytes()) for p in paths]


def algorithm_of(sync_every: int) -> DiLoCo:
    return DiLoCo(sync_every=sync_every, fragments=2, quorum=1, in_flight=2, lease_timeout_s=5.0)


def pause(session: Session, pause_s: float, declared: bool) -> None:
    if declared:
        with session.pause():
            time.sleep(pause_s)
    else:
        time.sleep(pause_s)


def summary(tape: list[RoundRecord], sync_every: int = 20) -> dict[str, Any]:
    """ξ_step and the grace window: before the pause (median), in the first two records
    after the round ``a`` is back in (``_back``, ``_next``: one round for the pause to be
    forgotten), and their largest values over the rest of the run (``_after_max``). A
    record's window follows from the previous record's estimates (its ``grace_s`` is what
    its round waited of it).

    The pause shows on the tape as the rounds ``a`` took no part in (``b`` closes them).
    """
    absent = [r.round for r in tape[5:] if "a" not in {p.learner for p in r.participants}]
    first = last = absent[0]
    while last + 1 in absent:  # the pause: the first stretch of rounds without a
        last += 1
    before = [r for r in tape[first // 2 : first] if r.timing.step_s is not None]
    after = [r for r in tape if r.round > last + 1]
    config = algorithm_of(sync_every).config()
    window = {
        r.round: timing.window_s(p.timing, config, schedule.gap_of(r.round, sync_every, 2))
        for p, r in itertools.pairwise(tape)
    }
    return {
        "step_s_before": float(np.median([r.timing.step_s for r in before])),
        "grace_s_before": float(np.median([window[r.round] for r in before])),
        "step_s_back": after[0].timing.step_s,
        "grace_s_back": window[after[0].round],
        "step_s_next": after[1].timing.step_s,
        "grace_s_next": window[after[1].round],
        "step_s_after_max": max(r.timing.step_s or 0.0 for r in after),
        "grace_s_after_max": max(window[r.round] for r in after),
        "zero_steps": sum(1 for r in after for x in r.rejections if x.reason.value == "zero_steps"),
        "rounds": len(tape),
        "rounds_without_a": last - first + 1,
    }
