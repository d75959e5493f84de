"""A node's resume state as bytes: exact round trips (real torch optimizers and schedulers),
and every hostile object refused by name before anything is restored."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, keys, modelkeys
from gm_core.resume import Drift
from gm_shell import DiLoCo, ResumeError, Session
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.payload import TensorEntry, header_bytes
from gm_shell.resume import (
    DIGEST_BYTES,
    MAGIC,
    META,
    Resumer,
    capture,
    decode,
    digest_key,
    encode,
    restore,
    seal,
)

RUN, NODE, KEY = "run-1", "node-a", keys.resume("node-a")


def round_trip(values: dict[str, Any], round: int = 3, step: int = 40) -> dict[str, Any]:
    data = seal(encode(values, run=RUN, node=NODE, round=round, step=step))
    saved = decode(data, run=RUN, node=NODE, key=KEY)
    assert (saved.round, saved.step) == (round, step)
    return saved.values


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, tensors and arrays by dtype, shape and bits."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, np.ndarray | np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        pairs = zip(a, b, strict=False)
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in pairs)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8)
)
arrays = st.builds(
    lambda dtype, shape, seed: (np.random.default_rng(seed).normal(size=shape) * 7).astype(dtype),
    st.sampled_from(["float64", "float32", "float16", "int64", "int8", "uint16", "bool"]),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**32),
)
leaves = st.one_of(scalars, arrays, arrays.map(lambda a: a.reshape(-1)[:1].sum()))
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-5, 5)), inner, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), trees, max_size=4))
def test_any_state_of_plain_values_and_arrays_comes_back_exactly(values: dict[str, Any]) -> None:
    assert same(values, round_trip(values))


def test_torch_tensors_of_every_dtype_come_back_exactly() -> None:
    base = torch.randn(3, 5)
    values = {
        name: base.to(getattr(torch, name))
        for name in ("float32", "float64", "float16", "bfloat16", "int64", "int8", "uint8", "bool")
    }
    values["scalar"] = torch.tensor(7.0)
    values["empty"] = torch.empty(0, 4)
    values["strided"] = base.t()  # not contiguous
    back = round_trip(values)
    assert same(values, back)
    assert back["strided"].is_contiguous()


def train_a_while(steps: int) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    for _ in range(steps):
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def test_an_optimizer_and_scheduler_restored_in_place_take_the_same_next_steps() -> None:
    model, opt, sched = train_a_while(7)
    state: dict[str, Any] = {"optimizer": opt, "scheduler": sched, "data": {"epoch": 1, "at": 7}}
    values = round_trip(capture(state))

    # A fresh process's objects (another model instance, same initial parameters as now).
    twin = torch.nn.Linear(4, 2)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.1, betas=(0.8, 0.95))
    twin_sched = torch.optim.lr_scheduler.LambdaLR(twin_opt, lambda s: min(1.0, (s + 1) / 10))
    fresh: dict[str, Any] = {"optimizer": twin_opt, "scheduler": twin_sched, "data": None}
    restore(fresh, values)
    assert fresh["data"] == {"epoch": 1, "at": 7}
    assert twin_sched.last_epoch == sched.last_epoch == 7
    assert twin_opt.param_groups[0]["betas"] == (0.8, 0.95)
    for _ in range(5):
        x = torch.randn(8, 4)
        for m, o, s in ((model, opt, sched), (twin, twin_opt, twin_sched)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
            s.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_local_progress_comes_back_exactly() -> None:
    progress = (
        (Drift(version=3, base_round=-1, steps=5, tokens=160), np.linspace(-1, 1, 7, dtype="f4")),
        (Drift(version=0, base_round=12, steps=0, tokens=0), np.zeros(2, dtype=np.float32)),
    )
    data = seal(encode({"x": 1}, run=RUN, node=NODE, round=11, step=40, progress=progress))
    saved = decode(data, run=RUN, node=NODE, key=KEY)
    assert saved.values == {"x": 1}
    assert saved.progress is not None
    assert [d for d, _ in saved.progress] == [d for d, _ in progress]
    for (_, got), (_, sent) in zip(saved.progress, progress, strict=True):
        assert same(got, sent)
    assert decode(GOOD, run=RUN, node=NODE, key=KEY).progress is None


def test_a_value_that_cannot_be_saved_is_named() -> None:
    with pytest.raises(TypeError, match=r"\['data'\]\[1\]: a set cannot be saved"):
        encode({"data": [1, {2}]}, run=RUN, node=NODE, round=0, step=0)


# -- hostile bytes ------------------------------------------------------------------------


def forged(document: Any, entries: tuple[TensorEntry, ...] = (), body: bytes = b"") -> bytes:
    """A resume object with a valid digest around ``document`` (so deeper checks are reached)."""
    text = document if isinstance(document, str) else json.dumps(document)
    file = header_bytes(entries, {META: text}) + body
    return MAGIC + blake3.blake3(file).digest() + file


def doc(state: Any, **fields: Any) -> dict[str, Any]:
    return {"run": RUN, "node": NODE, "round": 2, "step": 9, "state": state, **fields}


NONE = {"dict": []}
"""An empty state, as the format writes it."""


def progress_entry(
    *, version: int = 0, base_round: int = -1, steps: int = 0, tokens: int = 0, tag: str = "numpy"
) -> dict[str, Any]:
    """One fragment's progress as the format writes it, its array tensor 0."""
    fields = [["version", version], ["base_round", base_round], ["steps", steps]]
    fields += [["tokens", tokens], ["drift", {tag: 0}]]
    return {"dict": fields}


GOOD = seal(encode({"x": np.arange(4.0)}, run=RUN, node=NODE, round=2, step=9))
F32 = (TensorEntry(name="0", dtype="F32", shape=(2,)),)
HOSTILE = {
    "empty": (b"", "no gm-resume/1 header"),
    "other magic": (b"gm-resume/2\n" + GOOD[len(MAGIC) :], "no gm-resume/1 header"),
    "truncated": (GOOD[:-1], "digest does not match"),
    "one bit flipped": (
        GOOD[:-2] + bytes([GOOD[-2] ^ 1]) + GOOD[-1:],
        "digest does not match",
    ),
    "digest only": (GOOD[: len(MAGIC) + DIGEST_BYTES], "digest does not match"),
    "nothing after the digest": (MAGIC + blake3.blake3(b"").digest(), "malformed"),
    "not JSON": (forged("{"), "malformed"),
    "deep JSON": (forged("[" * 100_000 + "]" * 100_000), "malformed"),
    "huge integer": (forged('{"a": ' + "9" * 5000 + "}"), "malformed"),
    "fields missing": (forged({"run": RUN}), "lacks run, node, round, step or state"),
    "another node": (forged(doc({}, node="node-b")), "saved by node 'node-b'"),
    "another run": (forged(doc({}, run="run-2")), "of run 'run-2'"),
    "negative step": (forged(doc({}, step=-1)), "round 2 and step -1"),
    "boolean round": (forged(doc({}, round=True)), "round True"),
    "state not a mapping": (forged(doc([1])), "does not write"),
    "deep state": (forged(doc(json.loads('{"list": [' * 70 + "]}" * 70))), "nested deeper"),
    "unknown tag": (forged(doc({"pickle": "x"})), "unknown tag 'pickle'"),
    "two tags": (forged(doc({"list": [], "dict": []})), "does not write"),
    "tensor index": (forged(doc({"dict": [["a", {"torch": 0}]]})), "tensor 0 of 0"),
    "tensor bool index": (
        forged(doc({"dict": [["a", {"numpy": True}]]}), F32, bytes(8)),
        "tensor True of 1",
    ),
    "tensors misnumbered": (
        forged(doc({}), (TensorEntry(name="7", dtype="F32", shape=(2,)),), bytes(8)),
        "not numbered",
    ),
    "tensor bytes short": (forged(doc({}), F32, bytes(7)), "malformed"),
    "packed dtype": (
        forged(
            doc({"dict": [["a", {"numpy": 0}]]}),
            (TensorEntry(name="0", dtype="F4", shape=(2,)),),
            bytes(1),
        ),
        "numpy array of dtype F4",
    ),
    "unhashable key": (forged(doc({"dict": [[{"list": []}, 1]]})), "cannot be a key"),
    "odd pair": (forged(doc({"dict": [[1, 2, 3]]})), "not a [key, value] pair"),
    "names not strings": (forged(doc({"dict": [[1, 2]]})), "not a mapping of names"),
    "unknown field": (forged(doc({}, extra=1)), "lacks run, node, round, step or state"),
    "progress not a list": (forged(doc(NONE, progress={"dict": []})), "progress is not a list"),
    "progress entry fields": (
        forged(doc(NONE, progress={"list": [{"dict": [["version", 1]]}]})),
        "a progress entry without",
    ),
    "progress negative steps": (
        forged(doc(NONE, progress={"list": [progress_entry(steps=-2)]}), F32, bytes(8)),
        "progress counts [0, -1, -2, 0]",
    ),
    "progress round below -1": (
        forged(doc(NONE, progress={"list": [progress_entry(base_round=-2)]}), F32, bytes(8)),
        "progress counts [0, -2, 0, 0]",
    ),
    "progress not fp32": (
        forged(
            doc(NONE, progress={"list": [progress_entry()]}),
            (TensorEntry(name="0", dtype="F64", shape=(2,)),),
            bytes(16),
        ),
        "not a flat fp32 array",
    ),
    "adopted not a pair": (forged(doc(NONE, adopted=[3])), "adopted is not [round, digest]"),
    "adopted round negative": (forged(doc(NONE, adopted=[-1, "0" * 64])), "adopted round -1"),
    "adopted digest not hex": (forged(doc(NONE, adopted=[3, "Z" * 64])), "adopted digest"),
    "progress a torch tensor": (
        forged(doc(NONE, progress={"list": [progress_entry(tag="torch")]}), F32, bytes(8)),
        "not a flat fp32 array",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_objects_are_refused_by_name(name: str) -> None:
    data, why = HOSTILE[name]
    with pytest.raises(ResumeError) as info:
        decode(data, run=RUN, node=NODE, key=KEY)
    assert why in info.value.problem
    assert KEY in str(info.value)
    assert "delete that object" in str(info.value)


RUN_AUTH = auth.derive(bytes(range(32)))


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), trees, max_size=3))
def test_an_authenticated_runs_resume_state_is_keyed(values: dict[str, Any]) -> None:
    """In an authenticated run the digest is keyed BLAKE3 under the run key's resume subkey:
    the node reads its own state back, and a state anyone can write — the same bytes with a
    plain digest, or one sealed under another run key — is refused by name."""
    resume_key = digest_key(RUN_AUTH)
    assert resume_key is not None
    assert digest_key(None) is None
    body = encode(values, run=RUN, node=NODE, round=3, step=40)
    mine = seal(bytearray(body), resume_key)
    assert same(decode(mine, run=RUN, node=NODE, key=KEY, digest_key=resume_key).values, values)
    other = digest_key(auth.derive(bytes(range(1, 33))))
    for forged_state in (seal(bytearray(body)), seal(bytearray(body), other)):
        with pytest.raises(ResumeError, match="written without the run key"):
            decode(forged_state, run=RUN, node=NODE, key=KEY, digest_key=resume_key)
    with pytest.raises(ResumeError, match="digest does not match"):
        decode(mine, run=RUN, node=NODE, key=KEY)  # and an open run's node refuses it


def test_a_refused_object_restores_nothing_and_an_oversized_one_is_not_downloaded() -> None:
    mailbox = Mailbox.open("memory://resume-state-test")
    loop = LoopThread("resume-test")
    state: dict[str, Any] = {"data": 5}

    def resumer_of(state: dict[str, Any]) -> Resumer:
        return Resumer(
            state, mailbox=mailbox, loop=loop, run=RUN, node=NODE, every=1, max_bytes=1000
        )

    try:
        resumer = resumer_of(state)
        assert resumer.restore() is None
        two = (Drift(version=0, base_round=-1, steps=1, tokens=1), np.ones(2, dtype=np.float32))
        for sizes, problem in (((3,), r"fragments of \(2,\) values"), ((2,), "non-finite")):
            resumer = Resumer(
                state,
                mailbox=mailbox,
                loop=loop,
                run=RUN,
                node=NODE,
                every=1,
                max_bytes=1000,
                sizes=sizes,
            )
            nan = (two[0], np.full(2, np.nan, dtype=np.float32))
            sent = (two,) if sizes == (3,) else (nan,)
            resumer.save(0, 1)  # a plain save, then one with progress over it
            data = seal(encode({"data": 6}, run=RUN, node=NODE, round=0, step=1, progress=sent))
            asyncio.run_coroutine_threadsafe(mailbox.put(KEY, data), loop.loop).result()
            with pytest.raises(ResumeError, match=problem):
                resumer.restore()
            assert state == {"data": 5}
        resumer = resumer_of(state)
        asyncio.run_coroutine_threadsafe(mailbox.delete([KEY]), loop.loop).result()
        big = seal(encode({"data": np.zeros(400)}, run=RUN, node=NODE, round=0, step=1))
        asyncio.run_coroutine_threadsafe(mailbox.put(KEY, big), loop.loop).result()
        before = mailbox.stats.bytes_in
        with pytest.raises(ResumeError, match=r"over SessionOptions\.resume_max_bytes"):
            resumer.restore()
        assert mailbox.stats.bytes_in == before
        bad = forged(doc({"dict": [["data", 6], ["x", {"pickle": 1}]]}))
        asyncio.run_coroutine_threadsafe(mailbox.put(KEY, bad), loop.loop).result()
        with pytest.raises(ResumeError, match="unknown tag"):
            resumer.restore()
        assert state == {"data": 5}
        with pytest.raises(ResumeError, match="raise that limit"):
            resumer_of({"data": np.zeros(400)}).save(0, 0)
    finally:
        loop.stop()
        mailbox.close()


def test_resume_is_a_learners_own_state_and_never_the_model() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    algo = DiLoCo(sync_every=4)
    with pytest.raises(ValueError, match="not the model"):
        Session(model, algorithm=algo, mailbox="memory://x", resume={"m": model, "o": opt})
    with pytest.raises(ValueError, match="not the model"):
        Session(algorithm=algo, mailbox="memory://x", role="closer", resume={"o": opt})


@given(st.integers(0, keys.ROUND_LIMIT - 1), st.text("0123456789abcdef", min_size=64, max_size=64))
def test_the_adopted_record_comes_back_exactly(round_: int, digest: str) -> None:
    """What a resumed node checks its tape against (spec/protocol.md §16.5.2); a state saved
    before the field (or before any record was adopted) has none."""
    data = seal(encode({}, run=RUN, node=NODE, round=3, step=4, adopted=(round_, digest)))
    assert decode(data, run=RUN, node=NODE, key=KEY).adopted == (round_, digest)
    plain = seal(encode({}, run=RUN, node=NODE, round=3, step=4))
    assert decode(plain, run=RUN, node=NODE, key=KEY).adopted is None


ROSTER = modelkeys.roster({NODE: ("learner",), "node-b": ("learner",)})


def test_with_per_node_keys_a_state_is_the_nodes_own() -> None:
    """Per-node keys (spec/protocol.md §16.3): the state carries its node's signature over
    its digest, run and key; a member with the run key cannot write another node's state
    (its own signature, or none, is refused by name) and the node's own reads back."""
    resume_key = digest_key(RUN_AUTH)
    body = encode({"n": 1}, run=RUN, node=NODE, round=3, step=40)
    mine = modelkeys.signing(ROSTER, NODE)
    reader = modelkeys.signing(ROSTER, None)
    sealed = seal(bytearray(body), resume_key, mine, run=RUN, key=KEY)
    read = decode(sealed, run=RUN, node=NODE, key=KEY, digest_key=resume_key, signing=reader)
    assert read.values == {"n": 1}
    forgeries = {
        "another member's": seal(
            bytearray(body), resume_key, modelkeys.signing(ROSTER, "node-b"), run=RUN, key=KEY
        ),
        "unsigned": seal(bytearray(body), resume_key),
        "moved to another key": seal(bytearray(body), resume_key, mine, run=RUN, key="elsewhere"),
    }
    for what, data in forgeries.items():
        with pytest.raises(ResumeError, match="not signed"):
            decode(data, run=RUN, node=NODE, key=KEY, digest_key=resume_key, signing=reader)
        assert what
    off_roster = modelkeys.signing(modelkeys.roster({"node-b": ("learner",)}), None)
    with pytest.raises(ResumeError, match="not on the run's roster"):
        decode(sealed, run=RUN, node=NODE, key=KEY, digest_key=resume_key, signing=off_roster)
