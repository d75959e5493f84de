"""A learner that leaves badly: ``python leaver.py SPEC_JSON`` (see test_leaving.py).

It starts its session without a ``with`` block (as a Trainer callback would) or
inside one, trains until the test drops a ``go`` file, then ``go_steps`` more
steps, and then, by ``mode``:

- ``raise``: raises out of the training loop; nothing calls ``close()``;
- ``with-raise``: the same, inside ``with session:``;
- ``sigterm``: writes a ``ready`` file and keeps training until the test sends SIGTERM.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from runtime_worker import IN, TEACHER, torch_model

from gm_shell import DiLoCo, Session, SessionOptions


def main(spec: dict[str, Any]) -> None:
    out = Path(spec["out"])
    model, train = torch_model(seed=5)
    session = Session(
        model,
        algorithm=DiLoCo(**spec["algorithm"]),
        mailbox=spec["url"],
        node=spec["node"],
        options=SessionOptions(**spec["options"]),
    )
    if spec["mode"] == "with-raise":
        with session:
            loop(session, train, spec, out)
    else:
        session.start()
        loop(session, train, spec, out)


def loop(session: Session, train: Any, spec: dict[str, Any], out: Path) -> None:
    rng = np.random.default_rng(5)
    (out / "started").write_text("started")
    after_go = 0
    while True:
        x = rng.normal(size=(32, IN)).astype(np.float32)
        train(x, x @ TEACHER)
        session.step(samples=32)
        time.sleep(0.01)
        if (out / "go").exists():
            after_go += 1
        if after_go == spec["go_steps"]:
            if spec["mode"] == "sigterm":
                (out / "ready").write_text("ready")
            else:
                raise RuntimeError("a training step failed")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
