"""One node of a run that ends by itself, in a process of its own: ``python finish_worker.py
SPEC``.

``SPEC`` is JSON: the run ``url``, this ``node``, its ``role`` and, for a learner, how many
``steps`` its own data has and the seconds each takes (``step_s``). A learner trains a small
torch model with ``Session.run`` over its data; a dedicated closer (started first: it waits
for a learner to create the run) serves until the run is finished. Each prints one JSON
line saying whether it found the run finished, and exits 0 by itself.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, Session, SessionOptions

ALGORITHM = DiLoCo(sync_every=4, fragments=2, quorum=1, lease_timeout_s=2.0)
OPTIONS = SessionOptions(poll_s=0.05, renew_s=0.4, close_timeout_s=20.0, join_timeout_s=60.0)


def main(spec: dict[str, Any]) -> None:
    node, role = spec["node"], spec["role"]
    model, train = torch_model(0)
    if role == "closer":  # given a model, which it only checks: it must not create the run
        with Session(
            model, algorithm=ALGORITHM, mailbox=spec["url"], node=node, role=role, options=OPTIONS
        ) as session:
            session.serve()
        print(json.dumps({"finished": session.finished}))
        return
    rng = np.random.default_rng(abs(hash(node)) % 2**32)

    def step(_: int) -> int:
        x = rng.normal(size=(4, IN)).astype(np.float32)
        train(x, x @ TEACHER)
        time.sleep(spec["step_s"])
        return 4

    with Session(
        model, algorithm=ALGORITHM, mailbox=spec["url"], node=node, role=role, options=OPTIONS
    ) as session:
        session.run(step, range(spec["steps"]))
    print(json.dumps({"finished": session.finished}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
