"""The mailbox's own rules, on stores that need no server: keys, URLs, backoff, accounting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mailbox_servers import free_ports
from obstore.exceptions import GenericError, PermissionDeniedError

from gm_shell.accounting import PRICES_R2, PRICES_S3, PriceTable, RequestClass, Stats, cost_usd
from gm_shell.mailbox import (
    AccessDeniedError,
    BadRequestError,
    BucketMissingError,
    ConfigError,
    InvalidKeyError,
    Mailbox,
    PutOutcome,
    UnavailableError,
    _classify,
    _etag,
    check_key,
)
from gm_shell.stores import Backend, MailboxOptions


@pytest.mark.parametrize(
    "key", ["", "/rounds/1", "rounds/", "a//b", "../x", "a/./b", "a b", "ümlaut", "a\nb", "x?y"]
)
def test_bad_keys_are_refused_before_any_request(key: str) -> None:
    with Mailbox.open("memory://") as mailbox:
        for call in (mailbox.get, mailbox.probe):
            with pytest.raises(InvalidKeyError):
                asyncio.run(call(key))
        with pytest.raises(InvalidKeyError):
            asyncio.run(mailbox.put_once(key, b""))
        with pytest.raises(InvalidKeyError):
            asyncio.run(mailbox.delete([key]))
        assert mailbox.stats.total_requests == 0


def test_protocol_keys_are_accepted() -> None:
    for key in (
        "manifest.json",
        "rounds/000000000012.json",
        f"payloads/000000000003/{'ab' * 32}.st",
        "claims/000000000001/0002.json",
        "leases/node-a_1.json",
    ):
        assert check_key(key, "test") == key


@pytest.mark.parametrize(
    "url",
    [
        "ftp://bucket/x",
        "s3://",
        "memory://a/b?c=d",
        "s3://bucket/has space",
        "az:///prefix",
        "s3://bucket/../up",
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        Mailbox.open(url)


@pytest.mark.parametrize(
    ("url", "backend"),
    [
        ("memory://", Backend.MEMORY),
        ("s3://bucket/run", Backend.S3),
        ("gs://bucket/run", Backend.GCS),
        ("az://container/run", Backend.AZURE),
    ],
)
def test_urls_pick_their_backend_without_a_request(url: str, backend: Backend) -> None:
    options = MailboxOptions(region="us-east-1", account_name="gmtest")
    with Mailbox.open(url, options=options) as mailbox:
        assert mailbox.backend is backend
        assert mailbox.url == url


def test_file_url_makes_its_folder(tmp_path: Path) -> None:
    with Mailbox.open(f"file://{tmp_path / 'new' / 'run'}") as mailbox:
        assert mailbox.backend is Backend.FILE
    assert (tmp_path / "new" / "run").is_dir()


def test_memory_urls_share_a_store_by_name() -> None:
    async def body() -> None:
        with Mailbox.open("memory://shared/run") as a, Mailbox.open("memory://shared/run") as b:
            assert await a.put_once("x", b"1") is PutOutcome.CREATED
            assert await b.put_once("x", b"2") is PutOutcome.EXISTS
        with Mailbox.open("memory://") as c, Mailbox.open("memory://") as d:
            assert await c.put_once("x", b"1") is PutOutcome.CREATED
            assert await d.put_once("x", b"2") is PutOutcome.CREATED

    asyncio.run(body())


def test_azure_without_an_account_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(ConfigError, match="open"):
        Mailbox.open("az://container/run")


def test_closed_mailbox_refuses_work() -> None:
    mailbox = Mailbox.open("memory://")
    mailbox.close()
    mailbox.close()  # idempotent
    with pytest.raises(RuntimeError):
        asyncio.run(mailbox.get("x"))


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        MailboxOptions(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        MailboxOptions(backoff_base_s=1.0, backoff_cap_s=0.5)


def test_backoff_is_seeded_capped_and_growing() -> None:
    options = MailboxOptions(backoff_base_s=0.1, backoff_cap_s=0.8, seed=42)
    with (
        Mailbox.open("memory://", options=options) as a,
        Mailbox.open("memory://", options=options) as b,
    ):
        first = [a.backoff_s(n) for n in range(1, 8)]
        assert first == [b.backoff_s(n) for n in range(1, 8)]
    for attempt, delay in enumerate(first, start=1):
        ceiling = min(0.8, 0.1 * 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling
    other = MailboxOptions(backoff_base_s=0.1, backoff_cap_s=0.8, seed=43)
    with Mailbox.open("memory://", options=other) as c:
        assert [c.backoff_s(n) for n in range(1, 8)] != first


def test_nobody_listening_is_unavailable_after_bounded_attempts() -> None:
    (port,) = free_ports(1)  # free, so nothing listens there
    options = MailboxOptions(
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id="k",
        secret_access_key="s",
        region="us-east-1",
        max_attempts=3,
        backoff_base_s=0.01,
        backoff_cap_s=0.02,
        seed=1,
    )
    mailbox = Mailbox.open("s3://bucket/run", options=options)
    with mailbox, pytest.raises(UnavailableError) as raised:
        asyncio.run(mailbox.put_once("rounds/000000000001.json", b"r"))
    assert raised.value.key == "rounds/000000000001.json"
    stats = mailbox.stats
    assert (stats.put_requests, stats.retries, stats.failures, stats.bytes_out) == (3, 2, 1, 3)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Server returned non-2xx status code: 503 Service Unavailable", UnavailableError),
        ("Server returned non-2xx status code: 429 Too Many Requests", UnavailableError),
        ("Server returned non-2xx status code: 409 Conflict", UnavailableError),
        ("HTTP error: error sending request", UnavailableError),
        ("Server returned non-2xx status code: 400 Bad Request", BadRequestError),
        ("Server returned non-2xx status code: 401 Unauthorized", AccessDeniedError),
        ("status code: 404 Not Found: <Code>NoSuchBucket</Code>", BucketMissingError),
    ],
)
def test_generic_obstore_errors_are_classified_by_status(
    message: str, expected: type[Exception]
) -> None:
    assert _classify(GenericError(message)) is expected


def test_absent_and_denied_are_classified() -> None:
    assert _classify(FileNotFoundError("not found: 404")) is None
    assert _classify(FileNotFoundError("Object at location NoSuchBucket not found")) is None
    assert _classify(FileNotFoundError("<Code>ContainerNotFound</Code>")) is BucketMissingError
    assert _classify(PermissionDeniedError("403")) is AccessDeniedError


@pytest.mark.parametrize(
    ("raw", "clean"), [('"abc"', "abc"), ("abc", "abc"), ('W/"abc"', "abc"), ('"0x1F"', "0x1F")]
)
def test_etags_are_unquoted(raw: str, clean: str) -> None:
    assert _etag(raw) == clean


def test_cost_uses_public_request_prices() -> None:
    polling_day = Stats(list_requests=713 * 2880)  # the reference's LISTs per round, 30 s rounds
    assert cost_usd(polling_day, PRICES_S3) == pytest.approx(713 * 2880 * 0.005 / 1000)
    assert cost_usd(polling_day, PRICES_S3) == pytest.approx(10.27, abs=0.01)
    assert cost_usd(Stats(get_requests=1000), PRICES_S3) == pytest.approx(0.0004)
    assert cost_usd(Stats(get_requests=1000), PRICES_R2) == pytest.approx(0.00036)
    assert cost_usd(Stats(put_requests=1000, delete_requests=1000), PRICES_R2) == pytest.approx(
        0.0045
    )
    custom = PriceTable(
        name="x", list_per_1000=1, get_per_1000=2, put_per_1000=3, delete_per_1000=4
    )
    assert cost_usd(
        Stats(list_requests=1, get_requests=1, put_requests=1, delete_requests=1), custom
    ) == pytest.approx(0.01)


counts = st.integers(min_value=0, max_value=10**9)


@given(st.lists(counts, min_size=16, max_size=16))
def test_stats_subtract_what_they_add(values: list[int]) -> None:
    names = [f.name for f in attrs.fields(Stats)]
    a = Stats(**dict(zip(names, values[:8], strict=True)))
    b = Stats(**dict(zip(names, values[8:], strict=True)))
    assert (a + b) - b == a
    assert (a + b).total_requests == a.total_requests + b.total_requests
    assert sum((a + b).requests(c) for c in RequestClass) == (a + b).total_requests
    assert set((a + b).as_metrics()) >= {"mailbox_list_requests", "mailbox_bytes_in"}
