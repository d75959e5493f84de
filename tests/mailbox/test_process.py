"""Whole processes: one-shot commands exit cleanly, and a local folder is create-once across them.

``gm_shell.oneshot`` explains why a short script using obstore's async API could
abort at exit; these tests run the mailbox the way the CLI and the examples
will, as fresh interpreters, and demand exit code 0 every time.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest
from mailbox_servers import BUCKET, RunningServer

SCRIPTS = Path(__file__).parent / "scripts"
RUNS = 50
PARALLEL = 4


def _run(argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
def test_one_shot_command_exits_cleanly_50_times(seaweedfs: RunningServer) -> None:
    """Against S3 (SeaweedFS), where the raw async API aborted about one run in five."""
    options = attrs.asdict(seaweedfs.options)
    argv = [str(SCRIPTS / "oneshot_mailbox.py"), f"{seaweedfs.url}/oneshot", json.dumps(options)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda _: _run(argv), range(RUNS)))
    failed = [(r.returncode, r.stderr[-2000:]) for r in results if r.returncode != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs failed; first: {failed[0]}"


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
def test_raw_async_api_can_abort_at_exit(seaweedfs: RunningServer) -> None:
    """The control: obstore's async API alone aborts (SIGABRT) within 100 runs.

    If this starts passing zero aborts, obstore (or CPython) fixed the race and
    the note in ``gm_shell.oneshot`` should say so.
    """
    argv = [str(SCRIPTS / "raw_async_obstore.py"), seaweedfs.endpoint, BUCKET]
    codes: collections.Counter[int] = collections.Counter()
    for _ in range(100):
        codes[_run(argv).returncode] += 1
        if codes[-6] or codes[134]:
            return
    pytest.fail(f"no abort in 100 runs: {dict(codes)}")


def test_local_folder_create_once_across_processes(tmp_path: Path) -> None:
    """4 processes race for the same 25 keys in one folder: each key has one winner."""
    url = f"file://{tmp_path / 'bucket'}"
    go = tmp_path / "go"
    writers = [f"writer-{w}" for w in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "file_race.py"), url, w, "25", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in writers
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{w}").exists() for w in writers):
        assert time.monotonic() < deadline, "writers never got ready"
        assert all(p.poll() is None for p in procs), "a writer died before the start"
        time.sleep(0.005)
    go.touch()
    won: dict[str, list[str]] = {}
    for writer, proc in zip(writers, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        won[writer] = json.loads(out)
    winners = collections.Counter(key for keys in won.values() for key in keys)
    assert len(winners) == 25
    assert set(winners.values()) == {1}
    bucket = tmp_path / "bucket"
    for writer, keys in won.items():
        for key in keys:
            assert (bucket / key).read_text() == writer
