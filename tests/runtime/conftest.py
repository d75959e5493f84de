"""Fixtures for the runtime tests: run URLs on a local folder and on a real SeaweedFS server.

The server is started by the launcher the mailbox tests use (imported from
``tests/mailbox``), once per test session on the worker that runs the tests of
the ``runtime-s3`` xdist group.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helper modules beside this file and the mailbox tests' server launchers, by plain name.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "mailbox"))

import mailbox_servers
from runtime_harness import file_run, s3_run

from gm_shell.stores import MailboxOptions

S3_MARKS = (pytest.mark.servers, pytest.mark.xdist_group("runtime-s3"))


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mailbox_servers.RunningServer]:
    server = mailbox_servers.start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``slow_on_servers`` runs by default on file:// only: its SeaweedFS
    variants (``run_url``'s ``s3``) are slow ones."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_s3 = callspec is not None and callspec.params.get("run_url") == "s3"
        if on_s3 and item.get_closest_marker("slow_on_servers") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=[pytest.param("file"), pytest.param("s3", marks=S3_MARKS)])
def run_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, MailboxOptions]:
    """The same scenario on a local folder and on SeaweedFS."""
    if request.param == "file":
        return file_run(tmp_path)
    return s3_run(request.getfixturevalue("seaweedfs"))
