"""Group learners: the ranks of a ``torch.distributed`` group train one learner of the run.

Theory of operation
-------------------
::

    dist.init_process_group("nccl")                     # torchrun, every rank
    model = DDP(net)                                    # or fully_shard(net) (FSDP2)
    with Session(model, algorithm=..., mailbox=url) as s:   # the default group, detected
        for batch in data:
            loss(model, batch).backward(); opt.step(); opt.zero_grad()
            s.step(samples=len(batch))

Every rank runs the same code and calls the same :class:`~gm_shell.Session` methods at
the same steps. Group rank 0, the *leader*, is the run's node: it holds the session's
mailbox, lease, runtime and replica exactly as a single-process learner does. The other
ranks, *followers*, talk to no bucket: they count their steps and, at the steps the
leader names, carry out its *commands* (:class:`Op`, a small int64 tensor broadcast from
the leader; :class:`Link`). The group's intra-node collectives (DDP's all-reduce, FSDP2's
all-gather and reduce-scatter) are left as they are.

Commands. Every read or write of the parameters the leader makes goes through its
adapter (:class:`GroupModel`), which first tells the group what it does:

- ``GATHER f``: the leader reads fragment ``f``. Replicated parameters (DDP) are read on
  the leader alone, with no command (every rank holds the same values); a fragment with
  sharded parameters (FSDP2's DTensors) is all-gathered (``full_tensor``), every rank
  taking part. The leader keeps the full values; the followers drop theirs.
- ``SCATTER f``: the leader broadcasts the flat fp32 fragment; every rank writes it into
  its parameters, a DTensor rank its own shard only (cut locally, no further traffic).
- ``DEFINE`` (the names of a new fragment, as an object), ``FROZEN`` (the frozen
  parameters, gathered for their digests when the leader joins).
- ``HEARTBEAT``: sent about once a second while the leader waits in a stall (no commit
  arrives, the closer is stopped), so a follower's collective never runs into the
  group's timeout: a stalled group waits as long as the session allows, then fails as one.
- ``DONE`` (the next *check* step, the leader's aligned round, its divergence count and
  rank) or ``FAIL`` (what the leader raised): the end of a check.
- ``UNIT`` (an index into a :class:`~gm_shell.SharedQueue`'s units, -1 for none left):
  the unit the group trains next, with :meth:`Session.run` over a queue.
- ``RESUMED`` (the saved step and the ``resume=`` state the leader restored, as an
  object): every follower loads it, once, when the group joins.

Checks make ``step()`` collective-safe. At a check step the leader does what a single
learner's ``step()`` does when its barrier is reached (captures, fold-ins, waits, a
:class:`~gm_shell.StalledError`, a :class:`~gm_shell.RankLost`), with its followers in
:func:`follow` meanwhile, and then names the next check: the step its core waits for
next (:attr:`Pacer.barrier`), or the next step if work is already queued. Between two
checks no rank does anything but count, and a commit that arrives then is folded in at
the next check (at most one fragment's gap, ``H/P`` steps, later than a single learner
would; carry alignment keeps those steps). So every rank sees the same outcome at the
same step: each goes on, or each raises the leader's exception (the same class for a
stall, a lost rank or a divergence; :class:`GroupLeaderError` naming it otherwise). A
follower's cost is an increment and a compare per step, plus one small broadcast per
check, and the sharded fragment's all-gather at a due step.

Shards are gathered to the leader, not published as parts. The run's schema is the
full tensors, so groups of any world size, FSDP or DDP, and single processes merge
together; a snapshot stays one object per fragment, which the protocol, the closer and
the checker already handle (parts from every rank in parallel would need a multi-part
snapshot in the protocol: not built). The price is the all-gather of a fragment to every
rank at its due step (``full_tensor``; a gather to the leader alone has no DTensor API
for uneven shards) and the leader holding one fragment at full size on the host, which a
learner's replica holds anyway.

Death. A dead rank breaks the group's collectives: the survivors' next one (the leader's
command, DDP's all-reduce) raises, on gloo at once. The exception leaves the ``with``
block on the leader, whose session then *leaves* (its lease deleted, as for any
exception); a follower holds nothing in the bucket. If the leader died, its lease times
out. On NCCL a dead peer may only be noticed at the group's timeout (set one).

``resume=`` works for replicated parameters (DDP): the leader saves and restores the
state as a single learner does (its optimizer's state is every rank's), and hands what it
restored to its followers (``RESUMED``), so every rank goes on from the same step and
optimizer state. What is saved is the leader's: every rank loads it (a value that differs
by rank does not belong in ``resume=``). Not for sharded parameters (FSDP2: each rank's
optimizer state is its own shard; refused).
Not supported with a group: roles other than ``both``/``learner``.

:meth:`Session.run` over each rank's own data works: the leader marks the group's data
done and looks whether the run is finished while its followers wait in ``close()`` (no
heartbeat there: at most ``close_timeout_s`` plus two lease timeouts, far inside torch's
default collective timeouts). So does
:meth:`Session.run` over a :class:`~gm_shell.SharedQueue`: the group is one node of the
queue; the leader claims each unit and tells its followers (``UNIT``, with heartbeats
while it waits for one: the units left may be held by live peers for long), and every rank
trains that unit's batches (``load`` gets the unit's value on every rank: a rank takes its
own share of it, e.g. by ``dist.get_rank()``, as many batches on every rank).
"""

from __future__ import annotations

import enum
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple, TypeVar

import numpy as np

from gm_core.numerics.arrays import F32
from gm_core.numerics.layout import Layout
from gm_core.records import FrozenTensor
from gm_shell.models import (
    ModelError,
    Sync,
    TorchModel,
    _frozen_tensor,
    _layout,
    _TorchFragment,
    torch_held,
    unwrap_torch,
)

AUTO = "auto"
"""``Session(group=AUTO)``, the default: the default process group where it is initialized
over several ranks and the model is a DDP module or holds DTensor parameters."""

HEARTBEAT_S = 1.0
"""How often a waiting leader tells its followers it is alive (their collective is live)."""

WORD = 5
"""int64 fields of a command: the op and up to four arguments."""
T = TypeVar("T")


class Op(enum.IntEnum):
    DONE = 1
    FAIL = 2
    GATHER = 3
    SCATTER = 4
    DEFINE = 5
    FROZEN = 6
    HEARTBEAT = 7
    UNIT = 8
    RESUMED = 9


class GroupLeaderError(RuntimeError):
    """The group's leader raised an exception a follower cannot rebuild: named here."""


def resolve(group: Any, model: Any) -> Any | None:
    """The process group that trains ``model`` as one learner, or None (a single process).

    ``group`` is a ``ProcessGroup``, None (no group), or :data:`AUTO`. A group of one rank
    is no group: that process is a plain learner.
    """
    if group is None:
        return None
    dist = sys.modules.get("torch.distributed")
    if group == AUTO:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None  # a single-process user: nothing changes
        if dist.get_world_size() <= 1 or not _spans_ranks(model):
            return None
        return dist.group.WORLD
    if dist is None or not dist.is_initialized():
        raise ValueError("group= names a torch.distributed group, but none is initialized")
    return group if dist.get_world_size(group) > 1 else None


def _spans_ranks(model: Any) -> bool:
    """Whether ``model`` is one model held by several ranks: DDP, or DTensor parameters."""
    import torch

    layer = model
    while isinstance(layer, torch.nn.Module):
        if isinstance(layer, torch.nn.parallel.DistributedDataParallel):
            return True
        inner = getattr(layer, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            break
        layer = inner
    return sharded(model)


def sharded(model: Any) -> bool:
    """Whether ``model`` holds DTensor parameters (FSDP2's shards)."""
    import torch

    return isinstance(model, torch.nn.Module) and any(
        _is_dtensor(p) for p in unwrap_torch(model).parameters()
    )


def _is_dtensor(p: Any) -> bool:
    return hasattr(p, "device_mesh") and hasattr(p, "to_local")


class Done(NamedTuple):
    """The end of a check, as every rank learns it."""

    next_check: int
    round: int
    divergences: int
    rank: int
    """The rank the leader holds (``Session(ranks=N)``), else -1."""


class Link:
    """The leader's commands to its group: broadcasts from group rank 0."""

    def __init__(self, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.leads = self.rank == 0
        self._src = dist.get_global_rank(group, 0)
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
        self._word = torch.zeros(WORD, dtype=torch.int64, device=self.device)
        self._beat_at = time.monotonic()
        self.broken = False
        """A collective of this link raised: the group is gone, send nothing more."""
        self.failed = False
        """The followers were told of the leader's exception (once is all they hear)."""

    def send(self, op: Op, *args: int) -> None:
        import torch

        values = [int(op), *args] + [0] * (WORD - 1 - len(args))
        self._word.copy_(torch.tensor(values, dtype=torch.int64))
        self._collective(self._word)
        self._beat_at = time.monotonic()

    def receive(self) -> tuple[Op, list[int]]:
        self._collective(self._word)
        values = [int(v) for v in self._word.tolist()]
        return Op(values[0]), values[1:]

    def objects(self, value: Any = None) -> Any:
        """``value`` on the leader, broadcast; what it sent, on a follower."""
        box = [value]
        try:
            self._dist.broadcast_object_list(box, src=self._src, group=self.group)
        except BaseException:
            self.broken = True
            raise
        return box[0]

    def tensor(self, buffer: Any) -> None:
        """Broadcast ``buffer`` from the leader (in place on every rank)."""
        self._collective(buffer)

    def _collective(self, buffer: Any) -> None:
        try:
            self._dist.broadcast(buffer, src=self._src, group=self.group)
        except BaseException:
            self.broken = True
            raise

    def release(self) -> None:
        """Let go of the process group: the session is closed and sends nothing more.

        The user tears the group down (``destroy_process_group``) after the session; a
        session that still held it would keep gloo's backend alive until the garbage
        collector reached the session, which may be at interpreter exit, where destroying
        the backend's worker threads aborts the process ("terminate called without an
        active exception")."""
        self.broken = True
        self.group = None

    def heartbeat(self) -> None:
        """The leader waits: tell the followers so, at most once per :data:`HEARTBEAT_S`."""
        if time.monotonic() - self._beat_at >= HEARTBEAT_S and not self.broken:
            self.send(Op.HEARTBEAT)

    def done(self, done: Done) -> None:
        self.send(Op.DONE, *done)

    def fail(self, error: BaseException) -> None:
        """Tell the followers what the leader raised (nothing if the group is gone)."""
        if self.broken or self.failed:
            return
        self.failed = True
        self.send(Op.FAIL)
        self.objects(_failure(error))

    def waiting(self, call: Callable[[], T]) -> T:
        """``call()`` (on a thread of its own) while the followers hear heartbeats: the
        leader blocks outside a check (a queue's next unit) and they wait in a collective."""
        with ThreadPoolExecutor(1, thread_name_prefix="gm-group-wait") as pool:
            future = pool.submit(call)
            while True:
                try:
                    return future.result(timeout=HEARTBEAT_S)
                except FutureTimeout:
                    self.heartbeat()


def _failure(error: BaseException) -> tuple[str, str, tuple[Any, ...]]:
    from gm_shell.ranks import RankLost

    if isinstance(error, RankLost):
        return "RankLost", str(error), (error.node, error.rank, error.attempt)
    return type(error).__name__, str(error), ()


def _rebuild(kind: str, message: str, args: tuple[Any, ...]) -> BaseException:
    from gm_shell.pacer import StalledError
    from gm_shell.ranks import RankLost
    from gm_shell.session import DivergedError

    if kind == "RankLost":
        return RankLost(*args)
    if kind == "StalledError":
        return StalledError(message)
    if kind == "DivergedError":
        return DivergedError(message)
    return GroupLeaderError(f"the group's leader raised {kind}: {message}")


class GroupModel(TorchModel):
    """A torch model held by every rank of a group (whole, or sharded as DTensors).

    On the leader, its fragments tell the group before each collective read or write; on
    a follower, :func:`follow` makes the matching calls."""

    @staticmethod
    def _take(name: str, p: Any) -> Any:
        if getattr(p, "_is_flat_param", False):
            raise ModelError(f"{name!r} is FSDP's flat parameter: use fully_shard (FSDP2)")
        return p  # a DTensor too: its full shape is the schema's, read and written whole

    def __init__(self, model: Any, sync: Sync, link: Link) -> None:
        super().__init__(model, sync)
        self._link = link
        self.fragments: list[GroupFragment] = []

    def frozen(self) -> tuple[FrozenTensor, ...]:
        if self._link.leads and any(_is_dtensor(p) for p in self._frozen.values()):
            self._link.send(Op.FROZEN)
        return tuple(
            _frozen_tensor(n, v) for n, v in zip(self._frozen, self.follow_frozen(), strict=True)
        )

    def follow_frozen(self) -> list[F32]:
        """Every frozen parameter in full, fp32 on the host (all-gathering DTensors)."""
        import torch

        with torch.no_grad():
            return [_full(p).to("cpu", torch.float32).numpy() for p in self._frozen.values()]

    def fragment(self, names: Sequence[str]) -> GroupFragment:
        if self._link.leads:
            self._link.send(Op.DEFINE)
            self._link.objects(list(names))
        layout = _layout(self._specs, names)
        made = GroupFragment(layout, [self._params[n] for n in names], self._link, self)
        self.fragments.append(made)
        return made


def _full(p: Any) -> Any:
    """The whole value of parameter ``p``: all-gathered if it is a DTensor (collective)."""
    return p.detach().full_tensor() if _is_dtensor(p) else p.detach()


class GroupFragment:
    """One fragment of a :class:`GroupModel` (see the module doc for the commands)."""

    def __init__(self, layout: Layout, params: list[Any], link: Link, model: GroupModel) -> None:
        self.layout = layout
        self._params = params
        self._link = link
        self._index = len(model.fragments)
        self._sharded = any(_is_dtensor(p) for p in params)
        self._local = None if self._sharded else _TorchFragment(layout, params)

    def gather(self, out: F32) -> None:
        if self._local is not None:
            self._local.gather(out)  # replicated: the leader's own copy is the group's
            return
        self._link.send(Op.GATHER, self._index)
        self._gather_full(out)

    def _gather_full(self, out: F32 | None) -> None:
        import torch

        with torch.no_grad():
            for span, p in zip(self.layout.spans, self._params, strict=True):
                whole = _full(p)
                if out is not None:
                    torch.from_numpy(out[span.start : span.stop]).view(span.shape).copy_(whole)

    def scatter(self, flat: F32) -> None:
        self._link.send(Op.SCATTER, self._index)
        self._receive(flat)

    def _receive(self, flat: F32 | None) -> None:
        """Broadcast the leader's ``flat`` (None on a follower) and write it everywhere."""
        import torch

        link = self._link
        if flat is not None and link.device is None:
            buffer = torch.from_numpy(flat)
        elif flat is not None:
            buffer = torch.from_numpy(flat).to(link.device)
        else:
            buffer = torch.empty(self.layout.total, dtype=torch.float32, device=link.device)
        link.tensor(buffer)
        if self._local is not None:
            host = flat if flat is not None else np.asarray(buffer.cpu().numpy())
            self._local.scatter(host)
            return
        from torch.distributed.tensor import distribute_tensor

        with torch.no_grad():
            for span, p in zip(self.layout.spans, self._params, strict=True):
                values = buffer[span.start : span.stop].view(span.shape)
                if _is_dtensor(p):
                    mine = distribute_tensor(
                        values, p.device_mesh, p.placements, src_data_rank=None
                    )
                    p.to_local().copy_(mine.to_local())
                else:
                    p.copy_(values)

    def held(self, flat: F32) -> F32:
        return torch_held(self.layout, self._params, flat)


def next_unit(link: Link) -> int:
    """A follower's wait for the queue unit the leader trains next: its index in the
    queue's units, -1 once none is left (:meth:`Link.waiting` keeps the wait live)."""
    while True:
        op, args = link.receive()
        if op is Op.UNIT:
            return args[0]
        if op is Op.FAIL:
            raise _rebuild(*link.objects())
        if op is not Op.HEARTBEAT:
            raise GroupLeaderError(f"the group's leader sent {op.name} where a unit was due")


def follow(
    link: Link, model: GroupModel, resumed: Callable[[int, dict[str, Any]], None] | None = None
) -> Done:
    """A follower's side of a check: carry out the leader's commands until it is done
    (``resumed`` takes the step and the state the leader restored, on ``RESUMED``)."""
    while True:
        op, args = link.receive()
        if op is Op.DONE:
            return Done(*args)
        if op is Op.FAIL:
            raise _rebuild(*link.objects())
        if op is Op.RESUMED:
            step, values = link.objects()
            if resumed is not None:
                resumed(step, values)
        if op is Op.GATHER:
            model.fragments[args[0]]._gather_full(None)
        elif op is Op.SCATTER:
            model.fragments[args[0]]._receive(None)
        elif op is Op.DEFINE:
            model.fragment(link.objects())
        elif op is Op.FROZEN:
            model.follow_frozen()
