"""The failure that :mod:`gm_shell.oneshot` explains: obstore's async API in a short script.

Usage: ``python raw_async_obstore.py ENDPOINT BUCKET``. Exits 0 when the
interpreter shuts down cleanly, 134 (SIGABRT) when the race described in
``gm_shell.oneshot`` hits.
"""

from __future__ import annotations

import asyncio
import sys

from obstore.store import S3Store


async def main(endpoint: str, bucket: str) -> None:
    store = S3Store(
        bucket,
        prefix="raw-async",
        endpoint=endpoint,
        access_key_id="gm-test",
        secret_access_key="gm-test-secret",
        region="us-east-1",
        client_options={"allow_http": True},
    )
    await store.put_async("a", b"x")
    await (await store.get_async("a")).bytes_async()
    await store.list("").collect_async()
    await store.head_async("a")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
