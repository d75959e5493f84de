"""The synchronous data-parallel baseline, trained on exactly the tokens the gm learners see.

Theory of operation
-------------------
Data-parallel training of ``M`` workers averages the ``M`` workers' gradients
every step. This simulates it in one process: step ``t`` trains on the
concatenation of ``batch(t, 0) … batch(t, M−1)`` — the windows gm learner ``k``
trains on at its step ``t`` — and the mean loss over the concatenation has
exactly the gradient of the average of the ``M`` equal-sized micro-batch
gradients, so no per-worker loop is needed. Same model seed, same inner
optimizer and schedule, same number of steps, hence the same total tokens as the
gm run: the only difference left is how the workers synchronize.

Run as a process by the launcher: ``python -m gm_shell.demo.baseline RUN_DIR``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gm_shell.demo import charlm, layout
from gm_shell.demo.progress import Finished, ProgressWriter
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.demo.training import make_optimizer
from gm_shell.demo.worker import Hooks, single_thread, train


def run_baseline(spec: DemoSpec, stream: TokenStream, out: ProgressWriter) -> None:
    """Train the baseline to the end, writing progress and evaluations to ``out``."""
    model = charlm.build(spec.model, spec.model_seed)
    hooks = Hooks(
        batch_of=lambda step: stream.data_parallel_batch(step, spec.learners),
        eval_windows=stream.eval_windows(),
    )
    optimizer = make_optimizer(model, spec.inner)
    start = time.perf_counter()
    totals = train(spec, model, optimizer, hooks, out)
    out.write(
        Finished(
            steps=totals.steps,
            tokens=spec.tokens_at(totals.steps),
            compute_s=totals.compute_s,
            wall_s=time.perf_counter() - start,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gm_shell.demo.baseline RUN_DIR", file=sys.stderr)
        return 2
    single_thread()
    run = layout.RunDir(Path(args[0]))
    spec = run.load_spec()
    with ProgressWriter(run.progress(layout.BASELINE)) as out:
        run_baseline(spec, TokenStream(spec.data), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
