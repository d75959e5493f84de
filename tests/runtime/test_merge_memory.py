"""What a closer holds while it writes a merge: not the round's decoded deltas, and the
new theta's bytes only until they are uploaded (a real ``Session`` over ``memory://``)."""

from __future__ import annotations

import gc
import threading
import uuid
import weakref
from typing import Any

import numpy as np
import torch

from gm_core import keys
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.fragments import Role
from gm_shell.mailbox import Mailbox

OPTIONS = SessionOptions(poll_s=0.02, renew_s=0.3, close_timeout_s=0.2, stall_timeout_s=30.0)


def held(refs: list[weakref.ref[Any]]) -> int:
    """How many of these arrays something still refers to: garbage in a reference cycle
    (an exception's traceback holding a frame, say) is collected first, being no one's.
    Under load one delta of a round was once in ten runs alive at an encode: the finished
    task that had read it for the merge held it until the event loop let go of it
    (session 26; the merge's reads now put their deltas in its list, not in tasks)."""
    if any(r() is not None for r in refs):
        gc.collect()
    return sum(r() is not None for r in refs)


def _round_of(key: str) -> int:
    parsed = keys.parse(key)
    assert isinstance(parsed, keys.PayloadKey), key
    return parsed.round


def test_a_merge_encodes_with_its_deltas_gone_and_uploads_theta_while_momentum_encodes() -> None:
    """Each merge's encodes run with none of the round's decoded deltas alive (the merge
    dropped them: where one fragment is the model they were as big as the payloads being
    made), and the momentum is encoded while the new theta is uploaded: the momentum's
    encode waits here for the theta's upload to start, which the code before this test
    (both encodes in one trip, then both uploads) never did, so its waits timed out."""
    mailbox = Mailbox.open(f"memory://merge-{uuid.uuid4().hex[:10]}/run")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    algorithm = DiLoCo(sync_every=8, fragments=2, in_flight=2)
    decoded: dict[int, list[weakref.ref[Any]]] = {}
    alive_at_encode: list[int] = []
    theta_rounds: dict[str, int] = {}
    theta_put: dict[int, threading.Event] = {}  # by round: two fragments' merges overlap

    def uploaded(round_: int) -> threading.Event:
        return theta_put.setdefault(round_, threading.Event())

    overlapped: list[bool] = []
    with Session(model, algorithm=algorithm, mailbox=mailbox, node="solo", options=OPTIONS) as s:
        runtime = s._runtime
        assert runtime is not None
        codec = runtime._codec
        load, judge, encode = codec.load, codec.judged, codec.encode
        put_once = runtime._mailbox.put_once

        def loading(fragment: int, role: Role, ref: Any, data: Any, *rest: Any) -> Any:
            x = load(fragment, role, ref, data, *rest)
            if role is Role.DELTA:
                decoded.setdefault(_round_of(ref.key), []).append(weakref.ref(x))
            return x

        def judging(fragment: int, role: Role, ref: Any, *rest: Any) -> Any:
            x = judge(fragment, role, ref, *rest)  # this node's own learner's deltas
            decoded.setdefault(_round_of(ref.key), []).append(weakref.ref(x))
            return x

        def encoding(fragment: int, role: Role, round_: int, x: Any, *rest: Any, **kw: Any) -> Any:
            if role is Role.MOMENTUM:
                overlapped.append(uploaded(round_).wait(5.0))
            if role is not Role.DELTA:
                alive_at_encode.append(held(decoded.get(round_, [])))
            data, ref = encode(fragment, role, round_, x, *rest, **kw)
            if role is Role.THETA:
                theta_rounds[ref.key] = round_
            return data, ref

        async def putting(key: str, data: Any) -> Any:
            if key in theta_rounds:
                uploaded(theta_rounds[key]).set()
            return await put_once(key, data)

        codec.load = loading  # type: ignore[method-assign]
        codec.judged = judging  # type: ignore[method-assign]
        codec.encode = encoding  # type: ignore[method-assign]
        runtime._mailbox.put_once = putting  # type: ignore[method-assign]
        for _ in range(48):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            s.step(samples=1)
    assert len(overlapped) >= 4, overlapped  # rounds merged with their momentum
    assert all(overlapped), overlapped
    assert alive_at_encode
    assert max(alive_at_encode) == 0, alive_at_encode
    assert sum(len(refs) for refs in decoded.values()) >= 4, decoded


def test_a_closer_makes_its_new_theta_in_a_delta_it_alone_holds() -> None:
    """A closer's merge writes its new theta into one of the round's deltas (one nothing but
    the merge holds: :func:`gm_shell.runtime.spare`), not into a buffer made beside them:
    a solo node over ``memory://`` with zstd payloads, whose own delta is its own array (a
    bare payload's would be a view of bytes the store may hold, never written)."""
    mailbox = Mailbox.open(f"memory://into-{uuid.uuid4().hex[:10]}/run")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    algorithm = DiLoCo(sync_every=8, fragments=2, in_flight=2, compression="zstd")
    placed: list[bool] = []
    with Session(model, algorithm=algorithm, mailbox=mailbox, node="solo", options=OPTIONS) as s:
        runtime = s._runtime
        assert runtime is not None
        codec = runtime._codec
        merge_held = codec.merge_held

        def merging(*args: Any, into: int | None = None, **kw: Any) -> Any:
            deltas = args[3]
            target = None if into is None else deltas[into]
            merged = merge_held(*args, into=into, **kw)
            placed.append(target is not None and np.shares_memory(merged.theta, target))
            return merged

        codec.merge_held = merging  # type: ignore[method-assign]
        for _ in range(48):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            s.step(samples=1)
    assert len(placed) >= 4, placed
    assert all(placed), placed
