"""One node of a test run, in a process of its own: ``python runtime_worker.py SPEC_JSON``.

The node trains a small regression model (torch or MLX, same parameter names
and shapes) with a ``Session`` until a stop file appears or it has made its
steps, then closes and writes what the test needs to judge it: its final
parameters, fragment by fragment, and the commit its session left them at.
Every event goes to ``events.jsonl`` as it happens, so a test can wait for one, and
every snapshot the node creates goes to ``written.jsonl`` (key and bytes) as it lands, so
a judgement sees each one even where a sweep removed it before any look at the bucket.

Faults the test can ask for: ``nan_at_step`` turns a parameter into NaN once
(the delta of that fragment is then rejected as nonfinite, and the next commit
overwrites it); ``delta_scale`` multiplies every delta the node publishes
(:mod:`bench.poison`: a poisoned-but-finite learner); the test itself kills
(SIGKILL), hangs (SIGSTOP) and resumes (SIGCONT) the process.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from bench.poison import scale_published_deltas

from gm_core import keys
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.events import Event
from gm_shell.mailbox import Mailbox, PutOutcome
from gm_shell.replica import Replica
from gm_shell.stores import MailboxOptions

IN, HIDDEN = 8, 16
TEACHER = np.random.default_rng(1234).normal(size=(IN, 1)).astype(np.float32)


def torch_model(seed: int, hidden: int = HIDDEN, layers: int = 1) -> tuple[Any, Any]:
    """The test model. A ``hidden`` width other than :data:`HIDDEN` adds ``layers`` square
    middle layers of that width: a model whose bytes count (the memory bounds), while a
    batch's activations stay small beside it (a wide first layer alone would hold batch x
    width); in several layers, it can be dealt into as many fragments of equal size."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(IN, hidden)
            square = layers if hidden != HIDDEN else 0
            self.mid = torch.nn.ModuleList([torch.nn.Linear(hidden, hidden) for _ in range(square)])
            self.fc2 = torch.nn.Linear(hidden, 1)

        def forward(self, x: Any) -> Any:
            h = torch.tanh(self.fc1(x))
            for layer in self.mid:
                h = torch.tanh(layer(h))
            return self.fc2(h)

    model = Net()
    lr = 0.05 * HIDDEN / hidden  # the output sums ``hidden`` units: a wide one diverges else

    def train(x: np.ndarray, y: np.ndarray) -> float:
        # Plain SGD by hand: constructing a torch.optim optimizer imports torch._dynamo,
        # seconds per process here.
        loss = ((model(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)  # in place: no gradient-sized temporary
        return float(loss.item())

    return model, train


def mlx_model(seed: int) -> tuple[Any, Any]:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    mx.random.seed(seed)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(IN, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, 1)

        def __call__(self, x: Any) -> Any:
            return self.fc2(mx.tanh(self.fc1(x)))

    model = Net()
    opt = optim.SGD(learning_rate=0.05)

    def loss_fn(m: Any, x: Any, y: Any) -> Any:
        return mx.mean((m(x) - y) ** 2)

    grad = nn.value_and_grad(model, loss_fn)

    def train(x: np.ndarray, y: np.ndarray) -> float:
        loss, grads = grad(model, mx.array(x), mx.array(y))
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        return float(loss.item())

    return model, train


def jax_model(seed: int) -> tuple[Any, Any]:
    """The same network in flax nnx (torch's layout: ``weight`` is (out, in)), optax SGD."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, fan_in: int, fan_out: int, rngs: nnx.Rngs) -> None:
            bound = 1.0 / np.sqrt(fan_in)  # torch's nn.Linear initialization
            shape = (fan_out, fan_in)
            self.weight = nnx.Param(
                jax.random.uniform(rngs.params(), shape, minval=-bound, maxval=bound)
            )
            self.bias = nnx.Param(
                jax.random.uniform(rngs.params(), (fan_out,), minval=-bound, maxval=bound)
            )

        def __call__(self, x: Any) -> Any:
            return x @ self.weight[...].T + self.bias[...]

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.fc1 = Linear(IN, HIDDEN, rngs)
            self.fc2 = Linear(HIDDEN, 1, rngs)

        def __call__(self, x: Any) -> Any:
            return self.fc2(jnp.tanh(self.fc1(x)))

    model = Net(nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.sgd(0.05), wrt=nnx.Param)

    @nnx.jit
    def update(model: Net, optimizer: nnx.Optimizer[Net], x: Any, y: Any) -> Any:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    def train(x: np.ndarray, y: np.ndarray) -> float:
        return float(update(model, optimizer, x, y))

    return model, train


MODELS = {"torch": torch_model, "mlx": mlx_model, "jax": jax_model}
"""Each framework's twin of the test network, by the name a spec gives it."""


def poison(model: Any, framework: str) -> None:
    if framework == "torch":
        import torch

        with torch.no_grad():
            model.fc2.bias.fill_(float("nan"))
    else:
        import mlx.core as mx

        model.fc2.bias = mx.full(model.fc2.bias.shape, float("nan"))


class RecordingMailbox(Mailbox):
    """The node's real mailbox, which also notes each snapshot it creates (``written.jsonl``:
    what the node wrote, whatever the bucket keeps; ``Harness.written``)."""

    record_to: Path

    async def put_once(self, key: str, data: bytes) -> PutOutcome:
        outcome = await super().put_once(key, data)
        if outcome is PutOutcome.CREATED and _is_snapshot(key):
            line = json.dumps({"key": key, "data": base64.b64encode(data).decode()})
            with self.record_to.open("a") as file:
                file.write(line + "\n")
        return outcome


def _is_snapshot(key: str) -> bool:
    try:
        return isinstance(keys.parse(key), keys.SnapshotKey)
    except keys.BadKey:
        return False


def main(spec: dict[str, Any]) -> int:
    # Here, not at the top: scripts that import this module for its model lack tests/mailbox.
    from peak_memory import reset_peak, rss_bytes

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    framework = spec.get("framework", "torch")
    seed = int(spec["seed"])
    # A width other than HIDDEN: torch only (the memory-bound tests' wider model).
    width = {k: int(spec[k]) for k in ("hidden", "layers") if k in spec}
    model, train = MODELS[framework](seed, **width)
    if "delta_scale" in spec:
        scale_published_deltas(float(spec["delta_scale"]))
    log = (out / "events.jsonl").open("a", buffering=1)

    def record(event: Event) -> None:
        fields = {k: str(v) for k, v in attrs.asdict(event).items()}
        log.write(json.dumps({"event": event.kind, "wall": time.time(), **fields}) + "\n")

    mailbox = RecordingMailbox.open(spec["url"], options=MailboxOptions(**spec.get("mailbox", {})))
    assert isinstance(mailbox, RecordingMailbox)
    mailbox.record_to = out / "written.jsonl"
    session = Session(
        model,
        algorithm=DiLoCo(**spec["algorithm"]),
        mailbox=mailbox,
        node=spec["node"],
        role=spec.get("role", "both"),
        options=SessionOptions(**spec.get("options", {})),
        callbacks=[record],
        # Open on every store unless the test gives the run a key (hex).
        run_key=bytes.fromhex(spec["run_key"]) if spec.get("run_key") else None,
    )
    signal.signal(signal.SIGUSR1, lambda *_: dump_state(out, session))
    rng = np.random.default_rng(seed)
    stop = Path(spec["stop_file"])
    losses: list[float] = []
    with session:
        reset_peak()  # the node's peak memory from here on (see write_result)
        rss_start = rss_bytes()
        (out / "started").write_text(str(time.time()))
        for step in range(int(spec.get("steps", 10**9))):
            if stop.exists():
                break
            if step == spec.get("nan_at_step"):
                poison(model, framework)
            x = rng.normal(size=(32, IN)).astype(np.float32)
            losses.append(train(x, x @ TEACHER))
            session.step(samples=32)
            time.sleep(float(spec.get("step_sleep_s", 0.0)))
    write_result(out, session, model, losses, rss_start)
    mailbox.close()  # a session leaves a mailbox it was given open
    return 0


def dump_state(out: Path, session: Session) -> None:
    """On SIGUSR1: the machines' states, for a human debugging a failed run."""
    runtime = session._runtime
    if runtime is not None:
        text = f"{time.time()}\nlearner={runtime.learner!r}\ncloser={runtime.closer!r}\n"
        (out / "state.txt").write_text(text)


def write_result(
    out: Path, session: Session, model: Any, losses: list[float], rss_start: int
) -> None:
    from peak_memory import peak_rss_bytes

    from gm_shell.models import adapt

    assert session.manifest is not None
    assert session.checkpoint is not None
    replica = Replica(adapt(model), session.manifest.plan)
    fragments = {f"f{f}": replica.read(f) for f in range(len(session.manifest.plan.fragments))}
    np.savez(out / "params.npz", **fragments)
    result = {
        "round": session.checkpoint.round,
        "versions": list(session.checkpoint.versions),
        "losses": losses[-20:],
        "first_losses": losses[:20],
        "steps": len(losses),
        "stats": session.stats.as_metrics(),
        # Resident memory once the session had started, and the peak from then to here
        # (after close: every read, merge and payload of the run is in it).
        "rss_start": rss_start,
        "rss_peak": peak_rss_bytes(),
    }
    (out / "result.json").write_text(json.dumps(result))


def child(spec: dict[str, Any]) -> None:
    """Entry point in a forked process: the node's output goes to its own log file."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    log = os.open(out / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = main(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
