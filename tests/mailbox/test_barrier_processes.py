"""``Barrier`` across real processes, over a local folder and over S3 (SeaweedFS).

Each party is its own interpreter (``scripts/barrier_party.py``) with its own clock;
they share nothing but the bucket. Released parties must agree, generation by
generation, on who was released; a party that never comes makes every other party
time out with the same error naming who arrived; a party killed with SIGKILL after
arriving still counts (an arrival is a fact), and its restart under the same id
goes on with the next open generation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from mailbox_servers import RunningServer

from gm_core import keys

SCRIPT = Path(__file__).parent / "scripts" / "barrier_party.py"


def _start(
    url: str, options: dict[str, Any], party: str, parties: int, waits: int, timeout_s: float
) -> subprocess.Popen[str]:
    argv = [url, json.dumps(options), "gate", party, str(parties), str(waits), str(timeout_s)]
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines()]


def _released_together(url: str, options: dict[str, Any], parties: int, waits: int) -> None:
    names = [f"p{i}" for i in range(parties)]
    procs = [_start(url, options, n, parties, waits, 60.0) for n in names]
    outcomes = {n: _finish(p) for n, p in zip(names, procs, strict=True)}
    for name in names:
        assert outcomes[name] == [{"released": g, "members": names} for g in range(waits)], outcomes


def test_parties_are_released_together_generation_after_generation(tmp_path: Path) -> None:
    _released_together(f"file://{tmp_path / 'bucket'}", {}, parties=3, waits=3)


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
def test_parties_are_released_together_over_s3(seaweedfs: RunningServer) -> None:
    url = f"{seaweedfs.url}/barrier-{time.monotonic_ns()}"
    _released_together(url, attrs.asdict(seaweedfs.options), parties=3, waits=2)


def _timed_out_by_name(url: str, options: dict[str, Any]) -> None:
    """Three parties, p2 never comes (crashed before arriving): p0 and p1 time out with one
    verdict naming who arrived."""
    procs = {n: _start(url, options, n, 3, 1, 3.0) for n in ("p0", "p1")}
    outcomes = {n: _finish(p) for n, p in procs.items()}
    verdicts = {
        json.dumps({k: v for k, v in o[0].items() if k != "message"}) for o in outcomes.values()
    }
    assert len(verdicts) == 1, outcomes  # one broken marker, and both read the same one
    for lines in outcomes.values():
        assert len(lines) == 1, lines
        assert lines[0]["timed_out"] == 0
        assert lines[0]["by"] in lines[0]["arrived"]
        assert set(lines[0]["arrived"]) <= {"p0", "p1"}
        assert f"{len(lines[0]['arrived'])} of 3 arrived" in lines[0]["message"]


def test_a_party_that_never_comes_times_everyone_out_by_name(tmp_path: Path) -> None:
    _timed_out_by_name(f"file://{tmp_path / 'bucket'}", {})


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
def test_a_party_that_never_comes_times_everyone_out_over_s3(seaweedfs: RunningServer) -> None:
    _timed_out_by_name(
        f"{seaweedfs.url}/barrier-{time.monotonic_ns()}", attrs.asdict(seaweedfs.options)
    )


def test_a_killed_partys_arrival_counts_and_its_restart_goes_on(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    bucket = tmp_path / "bucket"
    victim = _start(url, {}, "p0", 2, 1, 60.0)
    arrival = bucket / keys.barrier_arrival("gate", 0, "p0")
    deadline = time.monotonic() + 60
    while not arrival.exists():
        assert time.monotonic() < deadline, "the victim never arrived"
        assert victim.poll() is None, victim.communicate()
        time.sleep(0.05)
    victim.kill()  # SIGKILL: no cleanup, the arrival stays
    victim.communicate()
    survivor = _start(url, {}, "p1", 2, 1, 60.0)
    assert _finish(survivor) == [{"released": 0, "members": ["p0", "p1"]}]
    # The restarted victim finds generation 0 closed and waits at the next one.
    restarted = _start(url, {}, "p0", 2, 1, 60.0)
    partner = _start(url, {}, "p2", 2, 1, 60.0)
    assert _finish(restarted) == [{"released": 1, "members": ["p0", "p2"]}]
    assert _finish(partner) == [{"released": 1, "members": ["p0", "p2"]}]
