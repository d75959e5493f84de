"""One node of a gm run that trains a small JAX model (flax nnx + optax, CPU is enough).

    python examples/jax_learner.py --mailbox file:///tmp/gm-example --node dave

It learns the same task, with the same parameter names and shapes, as
``examples/torch_learner.py`` and ``examples/mlx_learner.py`` (its ``Linear`` keeps
torch's layout: ``weight`` is (out, in)), so JAX, torch and MLX nodes can share one
run. The model is an ``nnx.Module``: the session writes the run's parameters into its
``nnx.Param`` variables in place, so the ``nnx.Optimizer`` and the jitted step go on
as they are. The only gm lines are the ``Session`` and ``s.step(samples=...)`` after
each optimizer update. (A pytree of parameters, a flax linen model's, goes into a
``gm_shell.JaxParams`` instead: see ``gm_shell.jax_model``.)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.stores import MailboxOptions

FEATURES, HIDDEN, BATCH = 16, 64, 32


class Linear(nnx.Module):
    """torch's ``nn.Linear``: ``weight`` (out, in) and ``bias``, its uniform initialization."""

    def __init__(self, fan_in: int, fan_out: int, rngs: nnx.Rngs) -> None:
        bound = 1.0 / np.sqrt(fan_in)

        def init(*shape: int) -> jax.Array:
            return jax.random.uniform(rngs.params(), shape, minval=-bound, maxval=bound)

        self.weight = nnx.Param(init(fan_out, fan_in))
        self.bias = nnx.Param(init(fan_out))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight[...].T + self.bias[...]


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.fc1 = Linear(FEATURES, HIDDEN, rngs)
        self.fc2 = Linear(HIDDEN, 1, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jnp.tanh(self.fc1(x)))


@nnx.jit
def train_step(model: Net, optimizer: nnx.Optimizer[Net], x: jax.Array, y: jax.Array) -> Any:
    def loss_fn(m: Net) -> jax.Array:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


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
    return parser.parse_args()


def main() -> None:
    args = arguments()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    model = Net(nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(0).normal(size=(FEATURES, 1)).astype("f4")  # the teacher
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
                x = rng.normal(size=(BATCH, FEATURES)).astype("f4")
                loss = train_step(model, optimizer, x, x @ w)
                session.step(samples=BATCH)
                if step % 200 == 0 or step == args.steps - 1:  # and the last step's loss
                    where = f"(round {session.round})"
                    print(f"{session.node} step {step}: loss {float(loss):.4f} {where}")
    checkpoint = session.checkpoint
    print(f"{session.node} final: model at round {checkpoint.round if checkpoint else '?'}")


if __name__ == "__main__":
    main()
