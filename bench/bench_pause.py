"""A 40 s pause in a real run: the round records' estimates before and after it.

Run: ``.venv/bin/python -m bench.bench_pause [--pause-s 40] [--step-s 0.05] [--steps 1200]``

Two learners train on threads through a ``file://`` bucket (the runtime tests'
scenario, :mod:`tests/runtime/pause_run.py`); learner ``a`` stops for ``--pause-s``
after a third of its steps, once undeclared and once inside ``Session.pause()``.
Printed per run: ξ_step and the grace window (median before the pause, largest once
``a`` is back), rounds closed while ``a`` was away, and zero-step rejections after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from pause_run import run, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause-s", type=float, default=40.0)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=1200)
    args = parser.parse_args()
    for declared in (False, True):
        with tempfile.TemporaryDirectory() as workdir:
            tape = run(
                Path(workdir) / "bucket",
                steps=args.steps,
                step_s=args.step_s,
                pause_at=args.steps // 3,
                pause_s=args.pause_s,
                declared=declared,
            )
        label = "Session.pause()" if declared else "undeclared"
        print(json.dumps({"pause": label, "pause_s": args.pause_s, **summary(tape)}))


if __name__ == "__main__":
    main()
