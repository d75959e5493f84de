"""Failures and configuration against real servers: what is retried, raised and counted.

Transient faults are injected by a real proxy in front of moto (see
``fault_proxy.py``); permanent ones come from the servers themselves: a bucket
that does not exist, a wrong Azure key, a port nobody listens on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from fault_proxy import CUT, RESET, FaultProxy
from mailbox_servers import RunningServer
from mailbox_targets import SERVER_MARKS

from gm_shell.mailbox import (
    AccessDeniedError,
    BadRequestError,
    BucketMissingError,
    Mailbox,
    MailboxError,
    PutOutcome,
    UnavailableError,
)
from gm_shell.stores import MailboxOptions

pytestmark = list(SERVER_MARKS)


@pytest.fixture
def proxy(moto: RunningServer) -> Iterator[FaultProxy]:
    port = int(moto.endpoint.rsplit(":", 1)[1])
    with FaultProxy(port).running() as running:
        yield running


def _through(proxy: FaultProxy, moto: RunningServer, run: str, **changes: Any) -> Mailbox:
    options = attrs.evolve(moto.options, endpoint=proxy.endpoint, **changes)
    return Mailbox.open(f"{moto.url}/{run}", options=options)


@pytest.mark.parametrize("fault", [503, 500, 429, RESET], ids=["503", "500", "429", "reset"])
def test_transient_faults_are_retried_and_counted(
    proxy: FaultProxy, moto: RunningServer, fault: int
) -> None:
    mailbox = _through(proxy, moto, f"transient-{fault}")

    async def body() -> None:
        proxy.spoil(fault, fault)
        assert await mailbox.put_once("rounds/000000000001.json", b"r") is PutOutcome.CREATED
        proxy.spoil(fault)
        got = await mailbox.get("rounds/000000000001.json")
        assert got is not None
        assert got.data == b"r"

    with mailbox:
        asyncio.run(body())
    stats = mailbox.stats
    assert (stats.put_requests, stats.get_requests, stats.retries) == (3, 2, 3)
    assert stats.failures == 0
    assert [status for _, _, status in proxy.seen] == [fault, fault, 200, fault, 200]


def test_a_body_cut_midway_is_received_again_from_its_first_byte(
    proxy: FaultProxy, moto: RunningServer
) -> None:
    """:meth:`Mailbox.receive` hands the body to its consumer as it arrives: one cut midway
    is the request's failure (retried and counted, the consumer called afresh and given the
    whole body), and what the consumer raises reaches the caller as it is, not retried."""
    mailbox = _through(proxy, moto, "cut")
    content = bytes(range(256)) * 8192  # 2 MiB: more than one chunk
    calls: list[int] = []

    def joined(chunks: Iterator[memoryview]) -> bytes:
        calls.append(0)
        return b"".join(chunks)

    def refusing(chunks: Iterator[memoryview]) -> bytes:
        next(chunks)
        raise LookupError("the consumer's own")

    async def body() -> None:
        assert await mailbox.put_once("payloads/000000000001/x.st", content) is PutOutcome.CREATED
        proxy.spoil(CUT)
        got = await mailbox.receive("payloads/000000000001/x.st", joined)
        assert got is not None
        assert got.value == content
        assert len(calls) == 2
        with pytest.raises(LookupError, match="the consumer's own"):
            await mailbox.receive("payloads/000000000001/x.st", refusing)

    with mailbox:
        asyncio.run(body())
    stats = mailbox.stats
    assert (stats.get_requests, stats.retries, stats.failures) == (3, 1, 0)
    assert [status for _, _, status in proxy.seen] == [200, CUT, 200, 200]


def test_persistent_faults_give_up_with_a_typed_error(
    proxy: FaultProxy, moto: RunningServer
) -> None:
    mailbox = _through(proxy, moto, "persistent", max_attempts=3)
    proxy.spoil(503, 503, 503, 503)

    with mailbox, pytest.raises(UnavailableError) as raised:
        asyncio.run(mailbox.probe("leases/a.json"))
    assert raised.value.operation == "probe"
    assert raised.value.key == "leases/a.json"
    assert "3 attempts" in str(raised.value)
    assert (mailbox.stats.get_requests, mailbox.stats.retries, mailbox.stats.failures) == (3, 2, 1)


@pytest.mark.parametrize(
    ("status", "error"), [(403, AccessDeniedError), (400, BadRequestError)], ids=["403", "400"]
)
def test_permanent_faults_are_not_retried(
    proxy: FaultProxy, moto: RunningServer, status: int, error: type[MailboxError]
) -> None:
    mailbox = _through(proxy, moto, f"permanent-{status}")
    proxy.spoil(status)

    with mailbox, pytest.raises(error) as raised:
        asyncio.run(mailbox.put("head.json", b"h"))
    assert (raised.value.operation, raised.value.key) == ("put", "head.json")
    assert (mailbox.stats.put_requests, mailbox.stats.retries) == (1, 0)


def test_backoff_sleeps_are_bounded(proxy: FaultProxy, moto: RunningServer) -> None:
    """Capped backoff: four attempts with a 0.05 s cap take well under a second."""
    mailbox = _through(proxy, moto, "bounded", backoff_base_s=0.05, backoff_cap_s=0.05)
    delays = [mailbox.backoff_s(attempt) for attempt in range(1, 10)]
    assert all(0.025 <= d <= 0.05 for d in delays)


@pytest.mark.parametrize("server", ["seaweedfs", "moto", "azurite"])
def test_missing_bucket_is_an_error_not_an_absence(
    request: pytest.FixtureRequest, server: str
) -> None:
    running: RunningServer = request.getfixturevalue(server)
    scheme = running.url.split("://")[0]
    mailbox = Mailbox.open(f"{scheme}://no-such-bucket/run", options=running.options)

    async def body() -> None:
        # HEAD on a missing bucket is a bare 404; the probe must still tell.
        with pytest.raises(BucketMissingError) as raised:
            await mailbox.probe("rounds/000000000001.json")
        assert raised.value.key == "rounds/000000000001.json"
        assert f"bucket 'no-such-bucket' does not exist at {mailbox.handle.endpoint}" in str(
            raised.value
        )
        assert str(raised.value).endswith(
            "Create it, or fix the bucket name (or the endpoint) in the mailbox URL"
        )
        with pytest.raises(BucketMissingError):
            await mailbox.get("rounds/000000000001.json")
        with pytest.raises(BucketMissingError):
            await mailbox.list("rounds/")
        # SeaweedFS refuses writes to a missing bucket as 403, the others as 404.
        with pytest.raises(BucketMissingError if server != "seaweedfs" else AccessDeniedError):
            await mailbox.put_once("rounds/000000000001.json", b"r")

    with mailbox:
        asyncio.run(body())
    assert mailbox.stats.retries == 0


def test_wrong_azure_key_is_access_denied(azurite: RunningServer) -> None:
    options = attrs.evolve(azurite.options, account_key="d3Jvbmcga2V5" * 4)
    mailbox = Mailbox.open(f"{azurite.url}/run", options=options)
    with mailbox, pytest.raises(AccessDeniedError) as raised:
        asyncio.run(mailbox.get("head.json"))
    assert raised.value.operation == "get"


def test_endpoint_and_credentials_come_from_the_environment(
    moto: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_* variables alone reach a plain-http endpoint (allow_http inferred from the URL)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    mailbox = Mailbox.open(f"{moto.url}/from-env", options=MailboxOptions(seed=0))

    async def body() -> None:
        assert await mailbox.put_once("manifest.json", b"{}") is PutOutcome.CREATED
        got = await mailbox.get("manifest.json")
        assert got is not None
        assert got.data == b"{}"

    with mailbox:
        asyncio.run(body())
