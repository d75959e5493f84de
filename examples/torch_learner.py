"""One node of a gm run that trains a small torch model (CPU is enough).

    python examples/torch_learner.py --mailbox file:///tmp/gm-example --node alice
    python examples/torch_learner.py --mailbox file:///tmp/gm-example --node bob

Every process started with the same ``--mailbox`` joins the same run: the first creates
it (manifest and initial parameters), the others adopt it and start from the newest
commit. Kill any of them at any moment; start them again; the run goes on. With
``--resume`` a node restarted with the same ``--node`` also goes on with its own optimizer
state and step count (saved in the bucket at commit boundaries). See
``examples/README.md`` for running across machines on S3, R2 or MinIO.

The task is a regression onto a fixed random teacher, so the loss printed should fall
towards zero on every node. The training loop is plain torch; the only gm lines are the
``Session`` and ``s.step(samples=...)`` after each optimizer step.
"""

from __future__ import annotations

import argparse
import contextlib
import logging

import numpy as np
import torch

from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.stores import MailboxOptions

FEATURES, HIDDEN, BATCH = 16, 64, 32


def teacher() -> torch.Tensor:
    """The function every node learns (the same on every machine: a fixed seed)."""
    return torch.from_numpy(np.random.default_rng(0).normal(size=(FEATURES, 1)).astype("f4"))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


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
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--resume", action="store_true", help="keep this node's optimizer and step across restarts"
    )
    args = parser.parse_args()
    if args.resume and (args.node is None or args.role == "closer"):
        parser.error("--resume is for a learner with a --node id: the id finds its saved state")
    return args


def main() -> None:
    args = arguments()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments, quorum=1)
    with Session(
        model,
        algorithm=algorithm,
        mailbox=args.mailbox,
        node=args.node,
        role=args.role,
        options=SessionOptions(poll_s=0.2, renew_s=2.0),
        mailbox_options=MailboxOptions(endpoint=args.endpoint),
        resume={"optimizer": optimizer} if args.resume else None,
    ) as session:
        if args.role == "closer":  # no training loop: close rounds until finished or Ctrl-C
            with contextlib.suppress(KeyboardInterrupt):
                session.serve()
        else:
            if args.parties > 1:  # nodes started together start training together
                with session.barrier("start", parties=args.parties) as start:
                    start.wait()
            train(session, model, optimizer, args.steps)
    checkpoint = session.checkpoint
    print(f"{session.node} final: model at round {checkpoint.round if checkpoint else '?'}")
    print(f"{session.node} requests: {session.stats.as_metrics()}")


def train(session: Session, model: Net, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """Plain torch training; ``session.step`` after each optimizer step is the only gm line."""
    w = teacher()
    print(f"{session.node} starts at step {session.step_count}")
    while (step := session.step_count) < steps:
        x = torch.randn(BATCH, FEATURES)
        loss = torch.nn.functional.mse_loss(model(x), x @ w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(samples=BATCH)
        if step % 200 == 0 or step == steps - 1:  # and the last step's loss
            print(f"{session.node} step {step}: loss {loss.item():.4f} (round {session.round})")


if __name__ == "__main__":
    main()
