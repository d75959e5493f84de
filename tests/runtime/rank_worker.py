"""One node of a ranked run, in a process of its own: ``python rank_worker.py SPEC``.

``SPEC`` is JSON: the run ``url`` and its ``mailbox`` options (an open run: no key), this
``node``, the run's ``ranks``, how many ``steps`` its slice has, the seconds each step
takes (``step_s``) and where to append one line per step it trains (``trace``: ``rank
step``, flushed, so the test can pause the process and see who trains). The node trains
a small torch model with ``Session.run`` over its rank's slice and prints one JSON line:
the rank it trained and whether it found the run finished, or the rank it lost
(``RankLost``, after which it exits 0 as well: losing a rank to a peer is an outcome, not
a failure of this process).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, MailboxOptions, RankLost, Session, SessionOptions

ALGORITHM = DiLoCo(sync_every=4, fragments=1, quorum=1, lease_timeout_s=2.0, takeover_floor_s=2.0)
OPTIONS = SessionOptions(poll_s=0.05, renew_s=0.4, close_timeout_s=20.0, join_timeout_s=60.0)


def main(spec: dict[str, Any]) -> None:
    model, train = torch_model(0)
    rng = np.random.default_rng(abs(hash(spec["node"])) % 2**32)
    trace = open(spec["trace"], "a", buffering=1)  # noqa: SIM115 (line-buffered log)
    session = Session(
        model,
        algorithm=ALGORITHM,
        mailbox=spec["url"],
        node=spec["node"],
        options=OPTIONS,
        mailbox_options=MailboxOptions(**spec.get("mailbox", {})),
        run_key=None,
        ranks=spec["ranks"],
    )
    session.start()
    rank = session.rank
    assert rank is not None

    def step(index: int) -> int:
        x = rng.normal(size=(4, IN)).astype(np.float32)
        train(x, x @ TEACHER)
        trace.write(f"{rank} {index}\n")
        time.sleep(spec["step_s"])
        return 4

    try:
        session.run(step, range(spec["steps"]))
    except RankLost as lost:
        print(json.dumps({"lost": lost.rank, "attempt": lost.attempt, "node": lost.node}))
        return
    print(json.dumps({"rank": rank, "finished": session.finished}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
