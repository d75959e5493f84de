"""The due step without a round trip: what it hands over is still exactly that step's.

``Session.step()`` at a due step copies the fragment the loop planned for it and
returns without waiting for the loop (:mod:`gm_shell.pacer`); where the core would
stall that step until a commit the training thread already holds is folded in, the
plan folds it in first. These tests train a real torch model and go straight on
with the next optimizer step after every ``step()``, then read each published delta
back from the bucket and compare it with ``anchor − θ`` as the parameters were at
that round's due step. They also pin down the pieces the due step is made of: the
direct copy of CPU fp32 parameters (following a parameter whose storage was
replaced) and the loop's forwarding of posts.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from runtime_worker import IN, TEACHER, torch_model

from gm_core import codec, keys, learner, schedule
from gm_core.numerics import align
from gm_core.records import Alignment, FragmentPlan, RoundRecord, Snapshot
from gm_shell import DiLoCo, Session, SessionOptions
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.models import adapt
from gm_shell.replica import IN_PLACE_SPAN, POOLED, Replica, Taken

OPTIONS = SessionOptions(
    poll_s=0.02, renew_s=0.3, close_timeout_s=0.2, stall_timeout_s=30.0, join_timeout_s=30.0
)
STEPS = 48


def train_and_record(
    alignment: str, pause_s: float, move_at: frozenset[int] = frozenset()
) -> tuple[Mailbox, Any, list[np.ndarray], dict[int, list[np.ndarray]]]:
    """A lone learner (no closer: every anchor stays the run's initial value) trains
    ``STEPS`` steps; θ of every fragment as ``step()`` found it, by step. Before training
    the steps ``move_at``, every parameter moves to new memory (``p.data = p.data.clone()``)."""
    mailbox = Mailbox.open(f"memory://due-{uuid.uuid4().hex[:10]}/run")
    model, train_step = torch_model(seed=3)
    algorithm = DiLoCo(
        sync_every=6,
        fragments=3,
        in_flight=STEPS,
        alignment=alignment,
        flush_on_close=False,
    )
    rng = np.random.default_rng(7)
    seen: dict[int, list[np.ndarray]] = {}
    with Session(
        model, algorithm=algorithm, mailbox=mailbox, node="solo", role="learner", options=OPTIONS
    ) as session:
        assert session.manifest is not None
        manifest = session.manifest
        replica = Replica(adapt(model), manifest.plan)
        count = len(manifest.plan.fragments)
        initial = [replica.read(f) for f in range(count)]
        for step in range(1, STEPS + 1):
            if step in move_at:
                with torch.no_grad():
                    for p in model.parameters():
                        p.data = p.data.clone()
            x = rng.normal(size=(16, IN)).astype(np.float32)
            train_step(x, x @ TEACHER)
            seen[step] = [replica.read(f) for f in range(count)]
            session.step(samples=16)  # and the next optimizer step follows at once
            if pause_s:
                time.sleep(pause_s)
    return mailbox, manifest, initial, seen


@pytest.mark.parametrize("pause_s", [0.0, 0.005], ids=["straight-on", "paced"])
@pytest.mark.parametrize("alignment", ["overwrite", "carry"])
def test_each_delta_is_the_parameters_at_its_due_step_though_training_goes_straight_on(
    alignment: str, pause_s: float
) -> None:
    mailbox, manifest, initial, seen = train_and_record(alignment, pause_s)
    cfg = manifest.config
    fragments = FragmentCodec(manifest)
    loop = LoopThread("due-step-test")
    try:
        rounds = [
            r for r in range(STEPS) if schedule.step_of(r, cfg.sync_every, cfg.fragments) <= STEPS
        ]
        for round_ in rounds:
            due = schedule.step_of(round_, cfg.sync_every, cfg.fragments)
            fragment = schedule.fragment_of(round_, cfg.fragments)
            got = loop.run(mailbox.get(keys.snapshot(round_, "solo")))
            assert got is not None, f"round {round_} (due at step {due}) was never published"
            snapshot = codec.decode(Snapshot, got.data)
            assert (snapshot.fragment, snapshot.steps) == (fragment, due)
            payload = loop.run(mailbox.get(snapshot.payload.key))
            assert payload is not None
            delta = fragments.load(fragment, Role.DELTA, snapshot.payload, payload.data)
            np.testing.assert_array_equal(
                delta,
                initial[fragment] - seen[due][fragment],
                err_msg=f"round {round_}: not the parameters of its due step {due}",
            )
            later = seen[min(due + 1, STEPS)][fragment]
            assert due == STEPS or not np.array_equal(delta, initial[fragment] - later)
    finally:
        loop.stop()
        mailbox.close()


def test_a_due_step_that_copied_a_moved_parameter_is_captured_afresh() -> None:
    """A planned due step copies CPU fp32 parameters through the views an earlier copy
    bound, without checking first (``_TorchFragment.copy_bound``); the loop checks the
    parameters' data pointers before it publishes the copy. Training that moves every
    parameter to new memory a step before a due step makes that copy stale (the views
    still read the old memory): it is never published, the round is captured afresh
    (``PublishFailed``, then a snapshot of a later step), and every delta in the bucket
    is θ of the step its snapshot names."""
    moves = frozenset({5, 23})
    mailbox, manifest, initial, seen = train_and_record("overwrite", 0.005, moves)
    cfg = manifest.config
    fragments = FragmentCodec(manifest)
    loop = LoopThread("due-step-test")
    afresh = 0
    try:
        for round_ in range(STEPS):
            due = schedule.step_of(round_, cfg.sync_every, cfg.fragments)
            if due > STEPS - 8:  # a round captured afresh near the end may not make it
                break
            got = loop.run(mailbox.get(keys.snapshot(round_, "solo")))
            assert got is not None, f"round {round_} (due at step {due}) was never published"
            snapshot = codec.decode(Snapshot, got.data)
            assert snapshot.steps >= due
            afresh += snapshot.steps > due
            payload = loop.run(mailbox.get(snapshot.payload.key))
            assert payload is not None
            delta = fragments.load(snapshot.fragment, Role.DELTA, snapshot.payload, payload.data)
            np.testing.assert_array_equal(
                delta,
                initial[snapshot.fragment] - seen[snapshot.steps][snapshot.fragment],
                err_msg=f"round {round_}: not the parameters of step {snapshot.steps}",
            )
    finally:
        loop.stop()
        mailbox.close()
    assert afresh >= len(moves), f"{afresh} rounds captured afresh after {len(moves)} moves"


def test_with_commits_folded_in_at_due_steps_each_delta_is_from_the_anchor_it_names() -> None:
    """Two fragments, ``in_flight`` 1: round r's due step waits for round r−1's commit
    (the other fragment), which often arrives between steps and is then folded in at
    that very step, before the copy, without asking the loop; otherwise the step waits
    for it (and, once it is handed over, folds it in and copies without waiting for the
    loop to hear of it), or it came earlier. In every case the snapshot's ``base_version`` names the
    anchor and the delta is that anchor minus θ at the due step."""
    check_rounds_against_their_due_steps(pause_s=0.02)


def test_a_due_step_taken_while_the_loop_computes_a_feed_comes_first_in_that_feed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop computes a learner's feed without the pacer's lock and commits it only if
    the training thread changed nothing meanwhile; a due step carried out in between makes
    it compute the feed again, that step's note first. The learner's transitions on the
    loop are slowed (the real ``advance``, after a sleep that lets the training thread in)
    and training goes straight on, so due steps land inside feeds: the feeds are redone,
    and still every round's delta is the anchor it names minus θ at its due step."""
    real = learner.advance
    training = threading.get_ident()

    def slow_advance(state: Any, event: Any) -> Any:
        if threading.get_ident() != training:
            time.sleep(0.002)
        return real(state, event)

    monkeypatch.setattr(learner, "advance", slow_advance)
    redone = check_rounds_against_their_due_steps(pause_s=0.0)
    assert redone > 0, "no feed met a due step: the test did not test the collision"


def check_rounds_against_their_due_steps(pause_s: float) -> int:
    """A learner and closer over a fresh bucket, ``in_flight`` 1, training 80 steps with
    ``pause_s`` between them: each round's delta is checked as soon as its record is there
    (round r is swept only once r+4 commits, which needs snapshots that later steps make).
    Returns how many feeds the runtime computed again (see the test above)."""
    mailbox = Mailbox.open(f"memory://due-{uuid.uuid4().hex[:10]}/run")
    model, train_step = torch_model(seed=5)
    algorithm = DiLoCo(sync_every=4, fragments=2, in_flight=1)
    rng = np.random.default_rng(11)
    loop = LoopThread("due-step-test")
    seen: dict[int, list[np.ndarray]] = {}
    checked = 0
    try:
        with Session(
            model, algorithm=algorithm, mailbox=mailbox, node="solo", options=OPTIONS
        ) as session:
            assert session.manifest is not None
            manifest = session.manifest
            replica = Replica(adapt(model), manifest.plan)
            fragments = FragmentCodec(manifest)

            def payload(fragment: int, ref: Any, role: Role) -> np.ndarray:
                got = loop.run(mailbox.get(ref.key))
                assert got is not None, ref.key
                return fragments.load(fragment, role, ref, got.data)

            thetas = {
                (f, fs.version): payload(f, fs.theta, Role.THETA)
                for f, fs in enumerate(manifest.init)
            }
            for step in range(1, 81):
                x = rng.normal(size=(16, IN)).astype(np.float32)
                train_step(x, x @ TEACHER)
                seen[step] = [replica.read(f) for f in range(2)]
                session.step(samples=16)
                while got := loop.run(mailbox.get(keys.round_record(checked))):
                    record = codec.decode(RoundRecord, got.data)
                    version = (record.fragment, record.version)
                    thetas.setdefault(version, payload(record.fragment, record.theta, Role.THETA))
                    snap = loop.run(mailbox.get(keys.snapshot(checked, "solo")))
                    assert snap is not None, f"round {checked} has no snapshot of ours"
                    snapshot = codec.decode(Snapshot, snap.data)
                    fragment = snapshot.fragment
                    anchor = thetas[(fragment, snapshot.base_version)]
                    delta = payload(fragment, snapshot.payload, Role.DELTA)
                    due = schedule.step_of(checked, 4, 2)
                    np.testing.assert_array_equal(
                        delta, anchor - seen[due][fragment], err_msg=f"round {checked}"
                    )
                    checked += 1
                if pause_s:
                    time.sleep(pause_s)
            runtime = session._runtime
            assert runtime is not None
            redone = runtime.feeds_redone
    finally:
        loop.stop()
        mailbox.close()
    assert checked >= 20, checked
    return redone


def test_a_due_step_whose_plan_is_made_waits_for_nothing_on_the_loop() -> None:
    """The common due step — the loop has planned it — neither reports to the core and
    waits for its answer, nor sleeps until the loop says more, nor finds the pacer's lock
    held: it copies, leaves its note and signals the loop (the counts of
    :attr:`Pacer.waits`; how long it takes is bench_step's). Before each due step the test
    waits, outside ``step()``, until the loop has planned it: a stall of the ``in_flight``
    bound, a pace that arrives late, or a plan to fold in a commit that an earlier step
    folded in already, are not this step's business. Every round's
    snapshot reaches the bucket and commits, so the notes left were fed."""
    mailbox = Mailbox.open(f"memory://due-{uuid.uuid4().hex[:10]}/run")
    model, train_step = torch_model(seed=13)
    algorithm = DiLoCo(sync_every=4, fragments=2, in_flight=2)
    rng = np.random.default_rng(5)
    due_steps = {schedule.step_of(r, 4, 2) for r in range(40)}
    checked = 0
    with Session(model, algorithm=algorithm, mailbox=mailbox, node="solo", options=OPTIONS) as s:
        pacer = s._pacer
        assert pacer is not None
        for step in range(1, 81):
            x = rng.normal(size=(16, IN)).astype(np.float32)
            train_step(x, x @ TEACHER)
            if step in due_steps:
                deadline = time.monotonic() + 30.0
                while not pacer.planned_for(step) and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert pacer.planned_for(step), f"the loop never planned due step {step}"
                waits, planned = pacer.waits, pacer.planned
                s.step(samples=16)
                assert pacer.planned == planned + 1, f"step {step} was not carried out by plan"
                assert pacer.waits == waits, f"due step {step} waited: {waits} -> {pacer.waits}"
                checked += 1
            else:
                s.step(samples=16)
        rounds = s.round
    published = LoopThread("due-step-test")
    try:
        for round_ in range(rounds + 1):
            assert published.run(mailbox.get(keys.round_record(round_))) is not None
    finally:
        published.stop()
        mailbox.close()
    assert checked == 40
    assert rounds >= 30, f"only {rounds + 1} rounds were folded in: the notes were not fed"


def test_the_direct_copy_follows_a_parameter_whose_storage_was_replaced() -> None:
    model = torch.nn.Linear(3, 2)
    access = adapt(model).fragment(["weight", "bias"])
    out = np.empty(8, np.float32)
    access.gather(out)
    np.testing.assert_array_equal(out[:6], model.weight.detach().numpy().ravel())
    with torch.no_grad():
        model.weight.data = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        model.bias.data = torch.tensor([7.0, 8.0]).expand(2).clone()
    access.gather(out)
    np.testing.assert_array_equal(out, np.arange(9, dtype=np.float32)[[0, 1, 2, 3, 4, 5, 7, 8]])
    access.scatter(-out)
    np.testing.assert_array_equal(model.weight.detach().numpy().ravel(), -np.arange(6))
    # A parameter that is no longer contiguous goes through torch's own copy.
    with torch.no_grad():
        model.weight.data = torch.zeros(3, 2).t()
    access.scatter(np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(model.weight.detach().numpy(), [[0, 1, 2], [3, 4, 5]])
    assert not model.weight.is_contiguous()


def test_posts_reach_the_loop_in_order_and_stop_ends_the_forwarder() -> None:
    loop = LoopThread("post-test")
    seen: list[int] = []
    done = threading.Event()
    for i in range(200):
        loop.poster(lambda i=i: seen.append(i))()  # type: ignore[misc]
    loop.poster(done.set)()
    assert done.wait(10)
    assert seen == list(range(200))
    before = {t.name for t in threading.enumerate()}
    assert {"post-test", "post-test-post"} <= before
    loop.stop()
    assert not {"post-test", "post-test-post"} & {t.name for t in threading.enumerate()}


def test_a_carry_copy_is_reused_after_its_commit_took_it_never_while_a_worker_may_read() -> None:
    """A ``carry`` copy comes back to the replica's free buffers when the commit that
    used it as the snapshot is folded in (the worker had encoded it before the upload the
    commit names), so the fragment's next capture copies into a buffer given back, not a
    new one; a copy forgotten because the commit left the snapshot out (its worker may
    still be encoding it) is never given back."""
    model = torch.nn.Linear(4, 3)
    replica = Replica(adapt(model), FragmentPlan(fragments=(("weight", "bias"),)))
    replica.overwrite_all([replica.read(0)])
    rng = np.random.default_rng(3)

    def train() -> np.ndarray:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.from_numpy(rng.normal(size=tuple(p.shape)).astype(np.float32)))
        return replica.read(0)

    theta = train()
    first = replica.take(0, 0, keep_copy=True)
    np.testing.assert_array_equal(first.theta, theta)
    committed = rng.normal(size=theta.shape[0]).astype(np.float32)
    after = train()
    replica.apply(0, 0, committed, Alignment.CARRY, 1.0)
    np.testing.assert_allclose(replica.read(0), after - theta + committed, rtol=1e-6)
    theta = train()
    made = replica.buffers
    second = replica.take(2, 0, keep_copy=True)
    assert replica.buffers == made  # a buffer given back (round 0's copy, or the fold's)
    np.testing.assert_array_equal(second.theta, theta)
    replica.forget(2)  # round 2's commit left our snapshot out: a worker may still read it
    replica.apply(2, 0, committed, Alignment.CARRY, 1.0)
    for round_ in (4, 6, 8):
        assert not np.shares_memory(replica.take(round_, 0, keep_copy=True).theta, second.theta)


def test_a_planned_capture_after_a_fold_in_copies_into_the_carry_copy_it_gave_back() -> None:
    """A plan that folds round 0's commit in before its capture gets no buffer of its own
    while round 0's ``carry`` copy is out: at the step, the capture copies into that copy,
    given back by the fold-in, and no buffer is made; the copy holds the parameters as the
    step left them. Another plan's buffer (``held``) is never made twice."""
    model = torch.nn.Linear(512, 512)
    replica = Replica(adapt(model), FragmentPlan(fragments=(("weight", "bias"),)))
    replica.overwrite_all([replica.read(0)])
    replica.take(0, 0, keep_copy=True)
    replica.take(1, 0, keep_copy=True)
    made = replica.buffers
    prepared = replica.prepare([(2, 0)], releasing=[0])
    assert [p.theta for p in prepared] == [None]
    assert replica.prepare([(2, 0)], held={(2, 0)})[0].theta is None
    assert replica.buffers == made
    assert replica.copies() == {0, 1}
    released = replica._taken[0].base  # the buffer round 0's copy lies in
    replica.apply(0, 0, replica.read(0) + 1.0, Alignment.CARRY, 1.0)
    (taken,) = replica.take_planned(prepared, keep_copy=True)
    assert replica.buffers == made
    assert taken.theta.base is released
    np.testing.assert_array_equal(taken.theta, replica.read(0))


def test_a_fold_in_through_a_buffer_keeps_one_more_free_and_any_that_fits_is_lent() -> None:
    """A commit folded in through a buffer (small tensors) takes one beside the ``carry``
    copy it reads, so the pool keeps two free from then on; and a buffer that fits is lent
    from anywhere in the pool (found by place: a deque's ``remove`` compared the arrays
    before it, which raised for two of different sizes)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    names = [name for name, _ in model.named_parameters()]
    replica = Replica(adapt(model), FragmentPlan(fragments=(tuple(names[:2]), tuple(names[2:]))))
    replica.overwrite_all([replica.read(f) for f in range(2)])
    replica.take(0, 0, keep_copy=True)
    replica.apply(0, 0, replica.read(0) + 1.0, Alignment.CARRY, 1.0)  # scratch and copy back
    assert len(replica._free) == 2
    small = replica.take(1, 1, keep_copy=False)  # 18 values: neither of the 72 fits
    replica.recycle(small)
    assert [len(b) for b in replica._free] == [72, 18]
    made = replica.buffers
    again = replica.take(2, 1, keep_copy=False)
    assert again.theta.base is small.theta.base
    assert replica.buffers == made


@pytest.mark.parametrize(
    ("width", "fragments", "more"),
    [(512, 1, 1), (256, 2, 2)],
    ids=["in-place", "through-a-buffer"],
)
def test_a_carry_learner_trains_on_through_its_copies_and_a_buffer_or_two_more(
    width: int, fragments: int, more: int
) -> None:
    """A ``carry`` learner keeps a copy per round out (``in_flight``) and, round after
    round, copies into the ones its commits give back: the pool makes ``in_flight``
    buffers and one more (two where a commit is folded in through a buffer: small
    tensors), not one per round (before session 25: a plan remade while another held a
    buffer made and faulted in one more, then let one go, and each fold-in through a
    buffer made its own: 21-22 made in these 20 rounds, each of the two models)."""
    mailbox = Mailbox.open(f"memory://carry-{uuid.uuid4().hex[:10]}/run")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 8))
    algorithm = DiLoCo(sync_every=8, fragments=fragments, in_flight=2, alignment="carry")
    with Session(model, algorithm=algorithm, mailbox=mailbox, node="solo", options=OPTIONS) as s:
        for _ in range(160):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            s.step(samples=1)
            time.sleep(0.02)  # a training step's time: the loop plans the due steps ahead
        assert s._replica is not None
        assert s._runtime is not None
        assert s._runtime.pacer is not None
        planned = s._runtime.pacer.planned
        made = s._replica.buffers
    assert planned, planned  # due steps carried out as planned (prepared buffers)
    assert made <= algorithm.in_flight + more, made


@pytest.mark.parametrize("contiguous", [True, False], ids=["in-place", "through-a-buffer"])
@pytest.mark.parametrize("mode", [Alignment.OVERWRITE, Alignment.BLEND, Alignment.CARRY])
def test_a_commit_is_folded_into_the_parameters_memory_as_align_folds_a_copy(
    mode: Alignment, contiguous: bool
) -> None:
    """Folding a commit in gives exactly what :func:`align` gives on a gathered copy, by
    every alignment (with the carry copy as the snapshot, and without one: the anchor).
    Where the parameters are CPU fp32 contiguous (and big: ``IN_PLACE_SPAN``) it is done
    in their own memory, and the replica makes no buffer for it (no fragment-sized copy);
    else through a pooled one."""
    model = torch.nn.Linear(600, 300)
    assert sum(p.numel() for p in model.parameters()) >= 2 * IN_PLACE_SPAN  # mean length
    if not contiguous:
        with torch.no_grad():
            model.weight.data = torch.empty(600, 300).t().copy_(model.weight)
    replica = Replica(adapt(model), FragmentPlan(fragments=(("weight", "bias"),)))
    replica.overwrite_all([replica.read(0)])
    rng = np.random.default_rng(5)

    def train() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.from_numpy(rng.normal(size=tuple(p.shape)).astype(np.float32)))

    anchor = replica.read(0)
    for round_, kept in ((0, True), (1, False)):
        train()
        snapshot = replica.take(round_, 0, keep_copy=True).theta.copy() if kept else anchor
        train()
        committed = rng.normal(size=anchor.shape[0]).astype(np.float32)
        expected = replica.read(0)
        align(expected, committed, mode, 0.25, snapshot)
        made = replica.buffers
        replica.apply(round_, 0, committed, mode, 0.25)
        np.testing.assert_array_equal(replica.read(0), expected)
        if contiguous:
            assert replica.buffers == made
        anchor = committed
    assert model.weight.is_contiguous() is contiguous


def test_the_pool_lends_one_fragments_buffer_to_another_and_keeps_few_free() -> None:
    """The replica's free buffers are shared by its fragments (each holds the largest one):
    a capture of one fragment, once its delta was encoded, is the next capture of another
    of another size, from half the largest up; a smaller fragment gets a buffer of its own
    size, never the largest's (whose pages would stay resident beside its copy); however
    many fragments, at most ``POOLED`` buffers stay free, the newest given back."""
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 2 + i) for i in range(6)])
    names = [name for name, _ in model.named_parameters()]
    plan = FragmentPlan(fragments=tuple((names[2 * i], names[2 * i + 1]) for i in range(6)))
    replica = Replica(adapt(model), plan)
    replica.overwrite_all([replica.read(f) for f in range(6)])
    sizes = [9 * (2 + i) for i in range(6)]  # 18 ... 63 values: from 36 up, half of 63 or more

    def pooled(taken: Taken) -> int:
        assert taken.theta.base is not None
        return int(taken.theta.base.ctypes.data)

    first = replica.take(0, 5, keep_copy=False)
    replica.recycle(first)
    second = replica.take(1, 2, keep_copy=False)
    assert pooled(second) == pooled(first)
    np.testing.assert_array_equal(second.theta, replica.read(2))
    replica.recycle(second)
    assert replica.has_free(2)
    assert not replica.has_free(1)  # the free one is the largest's: it would take a new one
    small = replica.take(2, 1, keep_copy=False)
    assert pooled(small) != pooled(first)
    assert small.theta.base is not None
    assert small.theta.base.shape == (sizes[1],)  # its own size, not the largest's
    replica.recycle(small)
    taken = [replica.take(r, r % 6, keep_copy=False) for r in range(12)]
    assert len({pooled(t) for t in taken}) == 12
    for t in taken:
        replica.recycle(t)
    kept = [pooled(replica.take(r, 5, keep_copy=True)) for r in range(4)]
    assert len(set(kept) & {pooled(t) for t in taken}) == POOLED
    assert kept[0] == pooled(taken[-1])  # the pool keeps the newest it was given back


@pytest.mark.parametrize("alignment", ["carry", "overwrite"])
def test_closing_publishes_every_fragments_final_delta_through_two_buffers(alignment: str) -> None:
    """Closing captures every fragment's final delta at once. The training thread, which
    has nothing else to do then, hands each capture over and waits for an earlier one's
    buffer to come back encoded before it copies the next, and keeps no ``carry`` copy
    (closing leaves the newest commit): the replica's pool makes at most two more buffers
    at close (one encoding while the next is copied; with one kept free, ``POOLED``, the
    fresh-clone CI of 6766eb9 once saw two made under load), not one per fragment (the
    whole model again), and its closer holds
    no more than ``in_flight`` of those deltas decoded ahead of their merges. Every final delta
    still commits, and the model is left at the newest commit."""
    mailbox = Mailbox.open(f"memory://due-{uuid.uuid4().hex[:10]}/run")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    algorithm = DiLoCo(sync_every=64, fragments=8, in_flight=2, alignment=alignment)
    options = attrs.evolve(OPTIONS, close_timeout_s=60.0)
    with Session(model, algorithm=algorithm, mailbox=mailbox, node="solo", options=options) as s:
        held = watch_bytes(s)
        for _ in range(5):  # fewer steps than any fragment's first capture (8)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            s.step(samples=1)
        replica = s._replica
        assert replica is not None
        made = replica.buffers
    assert replica.buffers - made <= 2, (made, replica.buffers)
    # The closer decodes at most in_flight (2) of its own learner's deltas ahead, and one
    # it reads: never the whole model's final deltas at once.
    assert held
    assert max(held) <= 3 * 4 * (64 * 64 + 64), held
    assert s.checkpoint is not None
    assert s.checkpoint.versions == (1,) * 8, s.checkpoint
    assert s.manifest is not None
    fragments = FragmentCodec(s.manifest)
    loop = LoopThread("check")
    try:
        for round_ in range(8):  # one round per fragment, each its final delta's
            got = loop.run(mailbox.get(keys.round_record(round_)))
            assert got is not None, round_
            record = codec.decode(RoundRecord, got.data)
            data = loop.run(mailbox.get(record.theta.key))
            assert data is not None
            committed = fragments.load(record.fragment, Role.THETA, record.theta, data.data)
            np.testing.assert_array_equal(replica.read(record.fragment), committed)
    finally:
        loop.stop()
        mailbox.close()


def watch_bytes(session: Session) -> list[int]:
    """The bytes of decoded deltas the session's closer holds after each one it keeps."""
    runtime = session._runtime
    assert runtime is not None
    deltas, held = runtime._deltas, []
    put = deltas.put

    def kept(*args: Any, **kwargs: Any) -> None:
        put(*args, **kwargs)
        held.append(deltas.nbytes)

    deltas.put = kept  # type: ignore[method-assign]
    return held


@pytest.mark.timeout(60)  # a wait that misses its wake-up fails here, not in an hour
def test_a_wait_for_a_buffer_ends_when_one_comes_back_or_none_is_to_come() -> None:
    """:meth:`Replica.wait_for_free` returns once a capture's buffer comes back encoded (from
    another thread), at once when no capture is out (nothing to wait for), and after its
    bound when a capture was dropped without being given back (a restart): never forever."""
    model = torch.nn.Linear(4, 3)
    replica = Replica(adapt(model), FragmentPlan(fragments=(("weight", "bias"),)))
    replica.overwrite_all([replica.read(0)])
    replica.wait_for_free(0, 3600.0)  # nothing out: returns at once
    taken = [replica.take(r, 0, keep_copy=False) for r in range(3)]  # the pool is dry
    assert not replica.has_free(0)
    worker = threading.Timer(0.05, replica.recycle, args=(taken[0],))
    worker.start()
    replica.wait_for_free(0, 3600.0)
    worker.join()
    assert replica.has_free(0)
    replica.take(3, 0, keep_copy=False)  # the one given back; two others never come back
    assert not replica.has_free(0)
    replica.wait_for_free(0, 0.05)  # bounded
    assert not replica.has_free(0)
