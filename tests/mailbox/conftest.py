"""Fixtures for the mailbox tests: real servers, one per session, and store targets.

Server fixtures are session-scoped and lazy: a run that selects only memory and
file tests starts nothing. Tests that use a server carry the ``servers`` marker
and ``xdist_group("servers")``, so under ``pytest -n N --dist loadgroup`` they all
land on one worker and each server starts once. A missing binary is a fixture
error whose message says how to install it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helper modules beside this file, importable by plain name from the tests too.
sys.path.insert(0, str(Path(__file__).parent))

import mailbox_servers
from mailbox_targets import (
    SERVERS,
    Target,
    gcs_target,
    local_target,
    server_target,
    store_params,
)


def _server(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[mailbox_servers.RunningServer]:
    workdir = tmp_path_factory.mktemp(name)
    server = mailbox_servers.LAUNCHERS[name](workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweedfs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[mailbox_servers.RunningServer]:
    yield from _server("seaweedfs", tmp_path_factory)


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mailbox_servers.RunningServer]:
    yield from _server("moto", tmp_path_factory)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mailbox_servers.RunningServer]:
    yield from _server("azurite", tmp_path_factory)


def make_target(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A fresh run prefix on store ``name``, starting its server if need be."""
    if name == "gcs":
        return gcs_target()
    if name not in SERVERS:
        return local_target(name, tmp_path)
    server: mailbox_servers.RunningServer = request.getfixturevalue(name)
    return server_target(name, server.url, server.options)


@pytest.fixture(params=store_params())
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    made = make_target(str(request.param), request, tmp_path)
    try:
        yield made
    finally:
        made.close()
