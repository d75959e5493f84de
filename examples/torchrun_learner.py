"""One learner of a gm run trained by a torch.distributed group (DDP or FSDP2), via torchrun.

    torchrun --standalone --nproc-per-node 2 examples/torchrun_learner.py --node-id a
    torchrun --standalone --nproc-per-node 2 examples/torchrun_learner.py --node-id b \
        --parallel fsdp2
    python examples/torch_learner.py --node carol       # a single process in the same run

Every rank runs this script: it wraps the model (``DistributedDataParallel``, or FSDP2's
``fully_shard``, which shards every parameter over the ranks), constructs the same
``Session`` and calls ``s.step`` after each optimizer step. The group is one learner of the
run (gm detects the default process group): rank 0 is the node in the bucket, the other
ranks follow it at the steps it names, and every rank's parameters are the group's. Groups
of any size, DDP or FSDP2, and single processes train one model together. On CPU the
backend is gloo; with GPUs use ``--backend nccl`` (one GPU per rank). (``--node-id``, not
``--node``: torchrun would take ``--node`` for its own ``--node-rank``.)

The model and task are ``torch_learner.py``'s, so the loss printed by rank 0 falls
towards zero. See the guide "Choosing the settings", section "Group learners".
"""

from __future__ import annotations

import argparse
import gc
import logging
import os

import torch
import torch.distributed as dist
from torch_learner import BATCH, FEATURES, Net, teacher

from gm_shell import DiLoCo, Session, SessionOptions


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mailbox", default="file:///tmp/gm-example", help="the run's URL")
    parser.add_argument("--node-id", default=None, help="the group's node id (default: host-pid)")
    parser.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sync-every", type=int, default=100, help="H: steps per cycle")
    parser.add_argument("--fragments", type=int, default=2, help="P: fragments per cycle")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # every rank starts from the same parameters (DDP checks it)
    net = Net().to(device)
    if args.parallel == "ddp":
        model: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    algorithm = DiLoCo(sync_every=args.sync_every, fragments=args.fragments, quorum=1)
    with Session(
        model,
        algorithm=algorithm,
        mailbox=args.mailbox,
        node=args.node_id,
        options=SessionOptions(poll_s=0.2, renew_s=2.0),
    ) as session:
        train(session, model, optimizer, args.steps, rank, device)
    checkpoint = session.checkpoint
    print(f"rank {rank} final: model at round {checkpoint.round if checkpoint else '?'}")
    dist.barrier()  # every rank done with the group's collectives before any tears it down
    dist.destroy_process_group()


def train(
    session: Session,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    rank: int,
    device: torch.device,
) -> None:
    """Plain DDP/FSDP2 training; ``session.step`` after each optimizer step on every rank."""
    w = teacher().to(device)
    torch.manual_seed(1 + rank)  # each rank its own batches
    while (step := session.step_count) < steps:
        x = torch.randn(BATCH, FEATURES, device=device)
        loss = torch.nn.functional.mse_loss(model(x), x @ w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(samples=BATCH)
        if step % 200 == 0 and rank == 0:
            print(f"rank 0 step {step}: loss {loss.item():.4f} (round {session.round})")


if __name__ == "__main__":
    main()
    # FSDP2's sharded modules hold the process group in reference cycles: left to the
    # collector at interpreter exit, gloo's backend is destroyed too late and the process
    # aborts ("terminate called without an active exception"). Collect them now.
    gc.collect()
