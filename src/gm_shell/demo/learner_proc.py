"""One demo learner process: train the character model as one node of a gm run.

Theory of operation
-------------------
The launcher starts ``python -m gm_shell.demo.learner_proc RUN_DIR INDEX`` once
per learner. The process reads the run's spec, builds the same model (same seed,
though only the node that creates the run contributes its initial parameters),
and runs the shared training loop with ``Session.step`` after every optimizer
step — the integration a user would write. Learner ``INDEX`` trains on the
stream's windows for worker ``INDEX``, so the learners together see exactly the
baseline's tokens. Learners do not evaluate (the launcher scores the committed
model), so all do the same work and none falls behind. Protocol events that are
not routine (takeovers, rejections, failures) are written to the progress file;
all of them go to ``logging`` (the log file).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from gm_shell import events
from gm_shell.demo import charlm, layout
from gm_shell.demo.progress import Finished, Noted, ProgressWriter
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.stream import TokenStream
from gm_shell.demo.training import make_optimizer
from gm_shell.demo.worker import Hooks, single_thread, train
from gm_shell.session import DiLoCo, Session, SessionOptions

ROUTINE = frozenset({"published", "aligned", "committed", "joined", "run_adopted"})
"""Event kinds that happen every round; the progress file keeps only the others."""

START_TIMEOUT_S = 300.0
"""How long a learner waits at the start barrier for the others before it starts anyway."""

POLL_S = 0.05
"""Rounds come every few hundred milliseconds in the demo (tiny model, small H), and a
``file://`` probe costs microseconds, so learners poll far faster than the 1 s default."""


def algorithm(spec: DemoSpec) -> DiLoCo:
    """The run's DiLoCo config from the spec's knobs (strided: blocks dealt to fragments)."""
    knobs = spec.gm
    return DiLoCo(
        sync_every=knobs.sync_every,
        fragments=knobs.fragments,
        quorum=spec.quorum,
        outer_lr=knobs.outer_lr,
        outer_momentum=knobs.outer_momentum,
        alignment=knobs.alignment,
        in_flight=knobs.in_flight,
        overlap_steps=knobs.overlap_steps,
        delta_format=knobs.delta_format,
        merge=knobs.merge,
        clip_norm_factor=knobs.clip_norm_factor,
        outlier_norm_factor=knobs.outlier_norm_factor,
        outlier_cosine=knobs.outlier_cosine,
        partition="strided",
        unit="tokens",
    )


def _noter(out: ProgressWriter) -> events.Callback:
    def note(event: events.Event) -> None:
        if event.kind not in ROUTINE:
            out.write(Noted(name=event.kind, detail=event.describe()))

    return note


def wait_for_peers(spec: DemoSpec, run: layout.RunDir, index: int) -> None:
    """Start together: mark this learner ready, then wait (bounded) until all are.

    Importing torch and building the corpus takes seconds, longer on a busy
    machine; learners that start training at different times make the first
    rounds lopsided. Data-parallel workers start together, so for the loss
    comparison the demo's learners do too. gm itself needs no such barrier.
    """
    mark = run.ready(layout.learner_name(index))
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    deadline = time.monotonic() + START_TIMEOUT_S
    names = [layout.learner_name(k) for k in range(spec.learners)]
    while not all(run.ready(name).exists() for name in names) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_learner(spec: DemoSpec, run: layout.RunDir, index: int, out: ProgressWriter) -> None:
    """Join the run, train ``spec.steps`` steps, close (flush), and report the totals."""
    stream = TokenStream(spec.data)
    model = charlm.build(spec.model, spec.model_seed)
    optimizer = make_optimizer(model, spec.inner)
    tokens = spec.data.tokens_per_batch
    wait_for_peers(spec, run, index)
    start = time.perf_counter()
    with Session(
        model,
        algorithm=algorithm(spec),
        mailbox=run.mailbox_url,
        node=layout.learner_name(index),
        options=SessionOptions(poll_s=POLL_S, renew_s=1.0),
        callbacks=[_noter(out)],
    ) as session:
        hooks = Hooks(
            batch_of=lambda step: stream.batch(step, index),
            after_step=lambda _: session.step(samples=spec.data.batch, tokens=tokens),
            round_of=lambda: session.round,
        )
        totals = train(spec, model, optimizer, hooks, out)
    out.write(
        Finished(
            steps=totals.steps,
            tokens=totals.steps * tokens,
            compute_s=totals.compute_s,
            wall_s=time.perf_counter() - start,
            requests=attrs.asdict(session.stats),
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gm_shell.demo.learner_proc RUN_DIR INDEX", file=sys.stderr)
        return 2
    single_thread()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run = layout.RunDir(Path(args[0]))
    index = int(args[1])
    with ProgressWriter(run.progress(layout.learner_name(index))) as out:
        run_learner(run.load_spec(), run, index, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
