"""``gm status``: the summary of a real run's tape, read from its bucket.

One real run makes the tape (two learner-and-closer sessions on threads through a
``file://`` folder; one learner is poisoned with NaN mid-run, so the closer
rejects its snapshots as ``nonfinite`` from then on). Every expectation is
computed from the tape itself, decoded record by record with the wire codec, not
through the code under test. Scenarios a short run does not produce — a takeover,
a priced request total, a malformed or missing record, a missing or leading head
hint — are made by copying the tape and writing exactly those objects into the
copy, through the same codec a closer uses (status only reads, so the objects
only need to be what a closer could write).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from runtime_worker import IN, TEACHER, torch_model

from gm_core import auth, codec, keys, schedule, tip
from gm_core import tape as tape_rules
from gm_core.records import Head, Manifest, Reason, Rejection, Requests, RoundRecord
from gm_shell import DiLoCo, Session, SessionOptions, align, cli, status
from gm_shell.accounting import PRICES_R2, PRICES_S3
from gm_shell.mailbox import Mailbox
from gm_shell.status import RunStatus, gather_status

H, P = 4, 2
STEPS = 48
POISON_STEP = 20
TOKENS_PER_SAMPLE = 16
S3_MARKS = (pytest.mark.servers, pytest.mark.xdist_group("runtime-s3"))
"""As in this folder's conftest: the SeaweedFS tests share one worker and one server."""

FAST = SessionOptions(
    poll_s=0.02,
    renew_s=0.3,
    close_timeout_s=10.0,
    stall_timeout_s=30.0,
    join_timeout_s=30.0,
    compute="numpy",
)


def train_two_nodes(
    url: str, *, poison: bool = True, alignment: str = "overwrite", unit: str = "samples"
) -> list[int]:
    """Two sessions train STEPS steps of 32 samples (of TOKENS_PER_SAMPLE tokens each, counted
    if ``unit`` is tokens); n1 turns NaN at POISON_STEP if ``poison``.

    Returns their final rounds.
    """
    algo = DiLoCo(
        sync_every=H,
        fragments=P,
        quorum=2,
        in_flight=1,
        alignment=alignment,
        lease_timeout_s=3.0,
        takeover_floor_s=4.0,
        unit=unit,
    )
    barrier = threading.Barrier(2)
    finals: dict[int, int] = {}

    def node(i: int) -> None:
        import torch

        model, train = torch_model(seed=i)
        rng = np.random.default_rng(i)
        with Session(model, algorithm=algo, mailbox=url, node=f"n{i}", options=FAST) as s:
            for step in range(STEPS):
                if poison and i == 1 and step == POISON_STEP:
                    with torch.no_grad():
                        model.fc2.bias.fill_(float("nan"))
                x = rng.normal(size=(32, IN)).astype(np.float32)
                train(x, x @ TEACHER)
                s.step(samples=32, tokens=32 * TOKENS_PER_SAMPLE)
            barrier.wait(timeout=60)  # nobody leaves while the other still needs a closer
        assert s.checkpoint is not None
        finals[i] = s.checkpoint.round

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(finals) == [0, 1], "a node failed (see the thread's traceback above)"
    return [finals[0], finals[1]]


@attrs.frozen
class Tape:
    folder: Path
    finals: list[int]


@pytest.fixture(scope="module")
def tape(tmp_path_factory: pytest.TempPathFactory) -> Tape:
    folder = tmp_path_factory.mktemp("status") / "run"
    return Tape(folder=folder, finals=train_two_nodes(f"file://{folder}"))


def copy_of(tape: Tape, tmp_path: Path) -> Path:
    """A private copy of the run folder that a test may change."""
    folder = tmp_path / "run"
    shutil.copytree(tape.folder, folder)
    return folder


def url(folder: Path) -> str:
    return f"file://{folder}"


def records_on_disk(folder: Path) -> list[RoundRecord]:
    """Every record, decoded straight from the folder: the expectation side of each test."""
    paths = sorted((folder / "rounds").iterdir())
    out = [codec.decode(RoundRecord, p.read_bytes()) for p in paths]
    assert [r.round for r in out] == list(range(len(out))), "the tape is a prefix of rounds"
    return out


def read(target: str | Path, **kwargs: Any) -> RunStatus:
    """gather_status on a fresh mailbox (its meter counts only this status)."""

    async def go() -> RunStatus:
        with Mailbox.open(target if isinstance(target, str) else url(target)) as box:
            return await gather_status(box, **kwargs)

    return asyncio.run(go())


def write(folder: Path, key: str, data: bytes) -> None:
    path = folder / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def append(folder: Path, record: RoundRecord) -> None:
    """Write the next record create-once, as a closer does."""

    async def go() -> None:
        with Mailbox.open(url(folder)) as box:
            outcome = await box.put_once(keys.round_record(record.round), codec.encode(record))
            assert outcome.value == "created"

    asyncio.run(go())


def gm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["status", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- a real run --------------------------------------------------------------------------


def test_the_newest_round_frontier_and_window_are_what_the_tape_holds(tape: Tape) -> None:
    records = records_on_disk(tape.folder)
    newest = records[-1]
    assert newest.round == max(tape.finals)  # the commit the sessions ended on
    assert len(records) > status.DEFAULT_LAST  # so the default window is a part of the tape

    s = read(tape.folder)

    assert s.rounds == len(records)
    assert s.head_hint == codec.decode(Head, (tape.folder / "head.json").read_bytes()).round
    assert s.newest is not None
    assert (s.newest.round, s.newest.step, s.newest.fragment, s.newest.version) == (
        newest.round,
        newest.step,
        newest.fragment,
        newest.version,
    )
    assert (s.newest.closer, s.newest.claim, s.newest.next_closer) == (
        newest.closer,
        newest.claim,
        newest.next_closer,
    )
    assert [f.version for f in s.frontier] == [fs.version for fs in newest.frontier]
    assert [f.theta_key for f in s.frontier] == [fs.theta.key for fs in newest.frontier]
    assert s.config.sync_every == H
    assert s.config.fragments == P
    assert s.config.quorum == 2

    window = records[-status.DEFAULT_LAST :]
    w = s.window
    assert w is not None
    assert (w.first_round, w.last_round, w.records) == (
        window[0].round,
        newest.round,
        len(window),
    )
    assert w.mean_participants == pytest.approx(
        sum(len(r.participants) for r in window) / len(window)
    )
    accepted = Counter(p.learner for r in window for p in r.participants)
    rejected = Counter(j.learner for r in window for j in r.rejections)
    tokens = Counter[str]()
    for r in window:
        for p in r.participants:
            tokens[p.learner] += p.tokens
    assert {t.learner: (t.rounds, t.tokens, t.rejected) for t in w.learners} == {
        name: (accepted[name], round(tokens[name] / P), rejected[name]) for name in {"n0", "n1"}
    }
    reasons = Counter(j.reason.value for r in window for j in r.rejections)
    assert reasons["nonfinite"] > 0  # n1 is NaN from POISON_STEP on
    assert {c.name: c.count for c in w.rejections} == dict(reasons)
    assert {c.name: c.count for c in w.closers} == dict(Counter(r.closer for r in window))
    assert [(t.round, t.claim) for t in w.takeovers] == [
        (r.round, r.claim) for r in window if r.claim > 0
    ]
    assert w.mean_quorum_s == pytest.approx(sum(r.quorum_s for r in window) / len(window))
    last_synced = {r.fragment: r.round for r in window if r.participants}
    assert [f.last_round for f in s.frontier] == [last_synced.get(f) for f in range(P)]

    assert s.estimates is not None
    assert s.estimates.step_s == newest.timing.step_s
    gap = schedule.gap_of(newest.round + 1, H, P)
    assert s.estimates.gap_steps == gap
    assert newest.timing.step_s is not None
    assert s.estimates.round_s == pytest.approx(gap * newest.timing.step_s)
    assert s.cost is not None
    assert s.cost.requests == newest.requests
    # Each counted snapshot reports its node's requests since the one before: its own
    # payload's PUT and the previous snapshot's PUT (its own lands in the next one).
    assert s.cost.reported
    counted = sum(len(r.participants) for r in records_on_disk(tape.folder))
    assert newest.requests.puts >= 2 * counted - 2
    assert s.unreadable == ()

    # O(recent): the manifest, the hint, the hinted record and one miss, then the window.
    assert s.status_requests.list_requests == 0
    assert s.status_requests.get_requests <= status.DEFAULT_LAST + 4


@pytest.mark.parametrize(
    ("unit", "per_step"), [("samples", 32), ("tokens", 32 * TOKENS_PER_SAMPLE)]
)
def test_each_learner_is_credited_with_the_steps_and_samples_or_tokens_it_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unit: str, per_step: int
) -> None:
    """A run with known totals: two healthy learners, STEPS steps of 32 samples each, carry;
    the run counts samples or tokens (its ``unit``), and status names the one it counts.

    Every step a learner trains is in the snapshot of each of the P fragments, so the
    snapshots' sum is P times the training; status counts each step once. Steps after a
    learner's last snapshot of a fragment may miss the final flush (it skips a fragment
    whose previous round is still open), so up to a gap of H/P steps per fragment is lost.
    """
    folder = tmp_path / "run"
    train_two_nodes(url(folder), poison=False, alignment="carry", unit=unit)
    records = records_on_disk(folder)
    assert not any(r.rejections for r in records)  # the premise: everything trained counts
    s = read(folder, everything=True)
    assert s.window is not None
    credited = {t.learner: (t.steps, t.tokens) for t in s.window.learners}
    assert set(credited) == {"n0", "n1"}
    for name, (steps, tokens) in credited.items():
        assert STEPS - H // P <= steps <= STEPS, (name, steps)
        summed = sum(p.steps for r in records for p in r.participants if p.learner == name)
        assert steps == round(summed / P)
        assert tokens == round(per_step * summed / P)  # the same count in every step
    code, out, _ = gm(capsys, url(folder), "--all")
    assert code == 0
    assert f"steps committed  {unit} committed" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("n0 "))
    assert row[2:4] == [f"{credited['n0'][0]:,}", f"{credited['n0'][1]:,}"]


def test_last_bounds_the_window_and_all_reads_the_whole_tape(tape: Tape) -> None:
    records = records_on_disk(tape.folder)
    short = read(tape.folder, last=3)
    assert short.window is not None
    assert (short.window.first_round, short.window.records) == (records[-3].round, 3)
    assert short.status_requests.get_requests <= 3 + 4

    whole = read(tape.folder, everything=True)
    assert whole.window is not None
    assert (whole.window.first_round, whole.window.records) == (0, len(records))
    assert whole.window.mean_participants == pytest.approx(
        sum(len(r.participants) for r in records) / len(records)
    )
    assert sum(t.rounds for t in whole.window.learners) == sum(len(r.participants) for r in records)
    assert whole.status_requests.get_requests >= len(records)
    assert (whole.rounds, whole.frontier) == (short.rounds, short.frontier)


def test_the_newest_round_is_found_without_a_head_hint_and_past_one_that_leads(
    tape: Tape, tmp_path: Path
) -> None:
    folder = copy_of(tape, tmp_path)
    rounds = len(records_on_disk(folder))
    (folder / "head.json").unlink()
    blind = read(folder, last=1)
    assert (blind.head_hint, blind.rounds) == (-1, rounds)
    # Galloping and bisecting, not a walk over the tape: about 2·log2(n) probes.
    assert blind.status_requests.get_requests < 2 + 2 * rounds.bit_length() + 2 < rounds

    write(folder, "head.json", codec.encode(Head(round=rounds + 40)))
    leading = read(folder, last=1)
    assert (leading.head_hint, leading.rounds) == (rounds + 40, rounds)
    assert leading.newest is not None
    assert leading.newest.round == rounds - 1

    write(folder, "head.json", b"not json")
    garbled = read(folder, last=1)
    assert (garbled.head_hint, garbled.rounds) == (-1, rounds)


def test_the_search_is_constant_with_a_current_hint_and_logarithmic_without(
    tmp_path: Path,
) -> None:
    """On a long tape (only existence matters to the search, so the records are stand-ins)."""
    n = 3_000

    async def go() -> None:
        with Mailbox.open(f"memory://search-{tmp_path.name}/run") as box:
            for start in range(0, n, 200):
                await asyncio.gather(
                    *(box.put(keys.round_record(r), b"x") for r in range(start, start + 200))
                )
            log = math.ceil(math.log2(n + 1))
            for hint, most in ((n - 1, 2), (n - 3, 5), (-1, 2 * log + 1), (n + 500, 2 * log + 1)):
                before = box.stats.get_requests
                seen: dict[int, bytes] = {}

                async def read(r: int) -> bytes | None:
                    got = await box.get(keys.round_record(r))
                    return None if got is None else got.data

                assert await status.tape_length(read, hint, seen) == n, hint
                spent = box.stats.get_requests - before
                assert spent <= most, (hint, spent)
                assert set(seen) <= set(range(n))

    asyncio.run(go())


# --- scenarios written into a copy of the tape --------------------------------------------


def next_record(previous: RoundRecord, **changes: Any) -> RoundRecord:
    """The record a closer would write for the next round if nobody contributed."""
    r = previous.round + 1
    f = r % P
    fields: dict[str, Any] = {
        "round": r,
        "step": schedule.step_of(r, H, P),
        "fragment": f,
        "version": previous.frontier[f].version,
        "participants": (),
        "rejections": (),
        "cosine": None,
        "theta": previous.frontier[f].theta,
        "outer": None,
        "update": None,
        "claim": 0,
        "prev": None if previous.prev is None else tape_rules.chain_digest(previous),
    }
    return attrs.evolve(previous, **{**fields, **changes})


def test_a_takeover_rejections_and_the_priced_request_total_show_up(
    tape: Tape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(tape, tmp_path)
    newest = records_on_disk(folder)[-1]
    took = next_record(
        newest,
        closer="n1",
        claim=1,
        next_closer="n1",
        rejections=(
            Rejection(learner="n0", reason=Reason.STALE),
            Rejection(learner="n1", reason=Reason.NONFINITE),
        ),
        requests=Requests(),  # a closer that reports none (as records before accounting)
    )
    total = Requests(lists=1_000, gets=10_000, puts=2_000, deletes=5)
    after = next_record(took, closer="n1", next_closer="n1", requests=total)
    append(folder, took)
    append(folder, after)

    s = read(folder, last=4)
    assert s.rounds == after.round + 1  # the head hint lags by two: found by probing
    assert s.newest is not None
    assert (s.newest.round, s.newest.claim, s.newest.closer) == (after.round, 0, "n1")
    assert s.window is not None
    assert [(t.round, t.closer, t.claim) for t in s.window.takeovers] == [(took.round, "n1", 1)]
    assert s.window.empty_rounds == 2
    reasons = {c.name: c.count for c in s.window.rejections}
    assert reasons["stale"] == 1
    assert s.window.recent_rejections[-2:] == (
        status.RejectionAt(round=took.round, learner="n0", reason="stale"),
        status.RejectionAt(round=took.round, learner="n1", reason="nonfinite"),
    )
    assert s.cost is not None
    assert s.cost.reported
    assert s.cost.requests == total
    # S3: LIST and PUT $0.005, GET $0.0004 per 1000; DELETE free.
    assert s.cost.usd == pytest.approx(0.005 + 0.004 + 0.010)
    assert s.cost.usd_per_round == pytest.approx(0.019 / (after.round + 1))
    r2 = read(folder, prices=PRICES_R2).cost
    assert r2 is not None
    assert r2.usd == pytest.approx(0.0045 + 0.0036 + 0.009)

    code, out, err = gm(capsys, url(folder), "--last", "4", "--prices", "r2")
    assert (code, err) == (0, "")
    assert f"takeovers     1: round {took.round} n1 (claim 1)" in out
    assert "1,000 LIST, 10,000 GET, 2,000 PUT, 5 DELETE" in out
    assert f"at {PRICES_R2.name} prices" in out
    assert f"newest: round {took.round} n1 nonfinite, round {took.round} n0 stale" in out

    # The taken-over round as the newest: its closer is shown as having claimed it.
    code, out, _ = gm(capsys, url(folder), "--last", "1")
    assert "not reported" not in out
    assert "took over" not in out
    (folder / "rounds" / f"{after.round:012d}.json").unlink()
    code, out, _ = gm(capsys, url(folder), "--last", "1")
    assert code == 0
    assert f"newest   round {took.round} at step {took.step}" in out
    assert "closed by n1 (took over via claim 1)" in out
    assert "requests not reported" in out


def test_an_unreadable_record_is_named_and_skipped(
    tape: Tape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(tape, tmp_path)
    records = records_on_disk(folder)
    n = len(records)
    middle, last = n - 3, n - 1
    doc = json.loads((folder / keys.round_record(middle)).read_bytes())
    doc["closer"] = "../n0"  # a path, not an id: the codec refuses the field by name
    write(folder, keys.round_record(middle), json.dumps(doc).encode())
    write(folder, keys.round_record(last), codec.encode(attrs.evolve(records[last - 1])))

    s = read(folder, last=5)
    assert s.rounds == n
    assert [u.round for u in s.unreadable] == [middle, last]
    assert s.unreadable[0].reason.startswith("closer:")
    assert "not its key's round" in s.unreadable[1].reason
    assert s.window is not None
    assert s.window.records == 3
    # The newest readable record stands in for the unreadable newest one.
    assert s.newest is not None
    assert s.newest.round == last - 1
    assert [f.version for f in s.frontier] == [fs.version for fs in records[last - 1].frontier]

    code, out, _ = gm(capsys, url(folder), "--last", "5")
    assert code == 0
    assert f"(round {last} is unreadable: see below)" in out
    assert "unreadable records (2, skipped):" in out
    assert f"  round {middle}: " in out

    (folder / "rounds" / f"{middle:012d}.json").unlink()  # a hole below the end
    s = read(folder, last=5)
    assert next((u.round, u.reason) for u in s.unreadable) == (middle, "record is missing")


def test_a_record_that_does_not_chain_is_named_and_the_one_the_nodes_adopted_shown(
    tape: Tape, tmp_path: Path
) -> None:
    """A chained run (spec/protocol.md §16.5): a record at a round's slot 0 that does not name
    the record before it is what the nodes skip; status names it and shows the record the
    closer wrote at the slot above."""
    folder = copy_of(tape, tmp_path)
    records = records_on_disk(folder)
    newest = records[-1]
    assert newest.prev == tape_rules.chain_digest(records[-2])  # the run is chained
    stray = next_record(newest, prev="0" * 64, closer="outsider")
    append(folder, stray)
    envelope = auth.for_run(
        codec.decode(Manifest, (folder / "manifest.json").read_bytes()).run_id, None
    )
    real = next_record(newest)
    write(folder, tape_rules.record_key(envelope, real.round, 1), codec.encode(real))

    s = read(folder, last=3)
    assert s.rounds == len(records) + 1
    assert [u.round for u in s.unreadable] == [stray.round]
    assert s.unreadable[0].reason.startswith("does not chain")
    assert s.newest is not None
    assert s.newest.round == stray.round
    assert s.newest.closer == newest.next_closer


def test_align_refuses_a_stray_record_far_ahead_that_the_head_names(
    tape: Tape, tmp_path: Path
) -> None:
    """The issue-12 attack on a reader: a plausible copy of the newest record 40 rounds ahead
    and a head naming it. ``align()`` loads the real newest commit, not the stray's."""
    folder = copy_of(tape, tmp_path)
    records = records_on_disk(folder)
    newest = records[-1]
    far = newest.round + 40
    stray = attrs.evolve(
        newest, round=far, step=schedule.step_of(far, H, P), fragment=far % P, closer="outsider"
    )
    write(folder, keys.round_record(far), codec.encode(stray))
    write(folder, keys.head(), codec.encode(Head(round=far)))
    model, _ = torch_model(seed=9)
    checkpoint = align(model, mailbox=url(folder), run_key=None)
    assert checkpoint.round == newest.round
    assert checkpoint.versions == tuple(fs.version for fs in newest.frontier)
    # gm status: the stray is named, the tape ends at the real newest record.
    s = read(folder, last=3)
    assert s.rounds == len(records)
    assert [(u.round, u.reason) for u in s.unreadable] == [(far, tip.STRAY.format(before=far - 1))]
    assert s.newest is not None
    assert s.newest.round == newest.round


def test_a_run_with_a_manifest_and_no_rounds_yet(
    tape: Tape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(tape.folder / "manifest.json", folder / "manifest.json")
    s = read(folder)
    assert (s.rounds, s.newest, s.window, s.estimates, s.cost) == (0, None, None, None, None)
    assert [f.version for f in s.frontier] == [0] * P
    code, out, _ = gm(capsys, url(folder))
    assert code == 0
    assert "no rounds committed yet" in out
    assert "fragments (frontier of manifest (initial))" in out


def test_no_run_or_no_store_is_a_clear_error_with_exit_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = gm(capsys, url(tmp_path))
    assert (code, out) == (1, "")
    assert "no run here (manifest.json is absent)" in err

    missing = tmp_path / "typo"
    code, _, err = gm(capsys, url(missing))
    assert code == 1
    assert "no folder" in err
    assert not missing.exists()  # a status creates nothing

    write(tmp_path, "manifest.json", b"{}")  # skipped (a creator would write manifest.01.json)
    code, _, err = gm(capsys, url(tmp_path))
    assert code == 1
    assert "no run here (no manifest this node can use: manifest.json: unreadable:" in err

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    code, _, err = gm(capsys, "s3://bucket/run", "--endpoint", f"http://127.0.0.1:{port}")
    assert code == 1
    assert "cannot read s3://bucket/run" in err
    assert "manifest.json" in err

    code, _, err = gm(capsys, "ftp://host/run")
    assert code == 1
    assert "unsupported mailbox URL scheme 'ftp'" in err
    assert "use memory://, file://, s3://" in err
    code, _, err = gm(capsys, url(tmp_path), "--last", "0")
    assert code == 2


def test_a_relative_file_url_reads_the_run_under_the_working_directory(
    tape: Tape, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file://runs/demo/mailbox`` (the README's spelling) is a folder, not host ``runs``."""
    shutil.copytree(tape.folder, tmp_path / "runs" / "demo" / "mailbox")
    monkeypatch.chdir(tmp_path)
    code, relative, _ = gm(capsys, "file://runs/demo/mailbox")
    assert code == 0
    code, absolute, _ = gm(capsys, url(tmp_path / "runs" / "demo" / "mailbox"))
    assert code == 0
    assert relative.splitlines()[1:] == absolute.splitlines()[1:]  # all but the URL line
    code, _, err = gm(capsys, "file://runs/typo")
    assert code == 1
    assert f"no folder {tmp_path / 'runs' / 'typo'}" in err


def test_json_round_trips_to_the_same_status(
    tape: Tape, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gm(capsys, url(tape.folder), "--json", "--last", "7")
    assert code == 0
    parsed = status.from_json(out)
    assert parsed == read(tape.folder, last=7)  # same tape, same reads, same counts
    assert status.to_json(parsed) == out.rstrip("\n")


# --- any mailbox ---------------------------------------------------------------------------


async def copy_tape(folder: Path, box: Mailbox) -> None:
    """The manifest, head hint and records of a run folder, into another bucket."""
    paths = [folder / "manifest.json", folder / "head.json", *(folder / "rounds").iterdir()]
    await asyncio.gather(
        *(box.put(str(p.relative_to(folder)), p.read_bytes()) for p in sorted(paths))
    )


@pytest.fixture(params=[pytest.param("memory"), pytest.param("s3", marks=S3_MARKS)])
def other_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    if request.param == "memory":
        return f"memory://status-{tmp_path.name}/run", None
    server = request.getfixturevalue("seaweedfs")
    return f"{server.url}/status-{tmp_path.name}", server.options


def test_the_same_tape_in_another_bucket_reads_the_same(
    tape: Tape, other_bucket: tuple[str, Any]
) -> None:
    target, options = other_bucket

    async def go() -> RunStatus:
        with Mailbox.open(target, options=options) as box:
            await copy_tape(tape.folder, box)
        with Mailbox.open(target, options=options) as box:
            return await gather_status(box, last=5, prices=PRICES_S3)

    there = asyncio.run(go())
    here = read(tape.folder, last=5)
    assert there.url == target
    ignored = ("url", "status_requests", "status_usd")
    assert attrs.evolve(there, **{f: getattr(here, f) for f in ignored}) == here
    assert there.status_requests.get_requests == here.status_requests.get_requests
