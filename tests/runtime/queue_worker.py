"""One node consuming a shared queue, in a process of its own: ``python queue_worker.py SPEC``.

``SPEC`` is JSON: the run ``url``, this ``node``, how many ``units`` of how many
``batches`` each, the seconds each step takes (``step_s``) and where to append one
line per batch it trains (``trace``: ``unit batch``, flushed, so the test can kill the
process mid-unit). The node trains a small torch model with ``Session.run``, exits 0
once every unit of the queue is done, and prints whether it found the run finished.
Optional: the ``mailbox`` options (an open run: no key) and its ``role`` (``both`` by
default; ``either`` also prints whether it was elected closer, how many units it gave
back and how often it was relieved and trained again; ``closer`` trains nothing and serves
until the run is finished), a ``gate`` file the node waits for before it opens its session,
having touched ``{gate}.ready`` (so the interpreter's start is not part of what a test
times), and a ``hold`` file while
which exists the node's next step does not begin (a test's schedule: the run's other
nodes act meanwhile), and ``fail_after``: the node's step raises once it has trained that
many batches (the node then leaves the run with the error, exit status 1).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, Role, Session, SessionOptions, SharedQueue
from gm_shell.stores import MailboxOptions

ALGORITHM = DiLoCo(sync_every=4, fragments=1, quorum=1, lease_timeout_s=2.0)
OPTIONS = SessionOptions(poll_s=0.05, renew_s=0.4, close_timeout_s=20.0, join_timeout_s=60.0)


def wait_while(busy: Any) -> None:
    """Poll a file the test controls (a gate or a hold), a schedule and not a timing guess."""
    while busy():
        time.sleep(0.02)


def main(spec: dict[str, Any]) -> None:
    if "QUEUE_WORKER_LOG" in os.environ:  # a folder: each node's log, to look into a failure
        log = Path(os.environ["QUEUE_WORKER_LOG"]) / f"{spec['node']}.log"
        logging.basicConfig(filename=log, level=logging.INFO, format="%(asctime)s %(message)s")
    model, train = torch_model(0)
    if "gate" in spec:
        Path(spec["gate"] + ".ready").touch()
        wait_while(lambda: not Path(spec["gate"]).exists())
    session = Session(
        model,
        algorithm=ALGORITHM,
        mailbox=spec["url"],
        node=spec["node"],
        role=spec.get("role", "both"),
        options=OPTIONS,
        mailbox_options=MailboxOptions(**spec.get("mailbox", {})),
        run_key=None,
    )
    if session.role is Role.CLOSER:
        with session:
            session.serve()
        print(json.dumps({"finished": session.finished}))
        return
    rng = np.random.default_rng(abs(hash(spec["node"])) % 2**32)
    trace = open(spec["trace"], "a", buffering=1)  # noqa: SIM115 (line-buffered log)

    def batches(unit: str) -> Any:
        for b in range(spec["batches"]):
            yield unit, b

    trained = [0]

    def step(batch: tuple[str, int]) -> int:
        if trained[0] == spec.get("fail_after", -1):
            raise RuntimeError(f"step fails at {batch[0]} {batch[1]}, as the test asked")
        trained[0] += 1
        if "hold" in spec:
            wait_while(Path(spec["hold"]).exists)
        x = rng.normal(size=(4, IN)).astype(np.float32)
        train(x, x @ TEACHER)
        trace.write(f"{batch[0]} {batch[1]}\n")
        time.sleep(spec["step_s"])
        return 4

    data = SharedQueue([f"u{i:02d}" for i in range(spec["units"])], batches, prefetch=1)
    with session:
        session.run(step, data)
    outcome = {"finished": session.finished, "elected": session.elected}
    print(json.dumps({**outcome, "given_back": session.given_back, "relieved": session.relieved}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
