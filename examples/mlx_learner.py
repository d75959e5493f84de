"""One node of a gm run that trains a small MLX model (``mlx[cpu]`` on Linux, Metal on a Mac).

    python examples/mlx_learner.py --mailbox file:///tmp/gm-example --node carol

It learns the same task, with the same parameter names and shapes, as
``examples/torch_learner.py``, so MLX and torch nodes can share one run: start a torch
node and an MLX node on the same ``--mailbox`` and both losses fall. The only gm lines
are the ``Session`` and ``s.step(samples=...)`` after each optimizer update.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.stores import MailboxOptions

FEATURES, HIDDEN, BATCH = 16, 64, 32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 1)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(mx.tanh(self.fc1(x)))


def loss_fn(model: Net, x: mx.array, y: mx.array) -> mx.array:
    return mx.mean((model(x) - y) ** 2)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mailbox", default="file:///tmp/gm-example", help="the run's URL")
    parser.add_argument("--node", default=None, help="this node's id (default: host-pid)")
    parser.add_argument("--role", default="both", choices=["both", "learner", "closer"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sync-every", type=int, default=100, help="H: steps per cycle")
    parser.add_argument("--fragments", type=int, default=2, help="P: fragments per cycle")
    parser.add_argument("--endpoint", default=None, help="S3-compatible endpoint (R2, MinIO)")
    parser.add_argument(
        "--parties", type=int, default=1, help="train once this many nodes are here (a barrier)"
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    model = Net()
    optimizer = optim.AdamW(learning_rate=3e-3)
    step_fn: Any = nn.value_and_grad(model, loss_fn)
    rng = np.random.default_rng()
    w = mx.array(np.random.default_rng(0).normal(size=(FEATURES, 1)).astype("f4"))
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments, quorum=1)
    with Session(
        model,
        algorithm=algorithm,
        mailbox=args.mailbox,
        node=args.node,
        role=args.role,
        options=SessionOptions(poll_s=0.2, renew_s=2.0),
        mailbox_options=MailboxOptions(endpoint=args.endpoint),
    ) as session:
        if args.role == "closer":  # no training loop: close rounds until finished or Ctrl-C
            with contextlib.suppress(KeyboardInterrupt):
                session.serve()
        else:
            if args.parties > 1:  # nodes started together start training together
                with session.barrier("start", parties=args.parties) as start:
                    start.wait()
            for step in range(args.steps):
                x = mx.array(rng.normal(size=(BATCH, FEATURES)).astype("f4"))
                loss, grads = step_fn(model, x, x @ w)
                optimizer.update(model, grads)
                mx.eval(model.parameters(), optimizer.state)
                session.step(samples=BATCH)
                if step % 200 == 0 or step == args.steps - 1:  # and the last step's loss
                    where = f"(round {session.round})"
                    print(f"{session.node} step {step}: loss {loss.item():.4f} {where}")
    checkpoint = session.checkpoint
    print(f"{session.node} final: model at round {checkpoint.round if checkpoint else '?'}")


if __name__ == "__main__":
    main()
