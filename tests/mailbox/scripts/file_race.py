"""One writer process of the local-folder create-once race.

Usage: ``python file_race.py URL WRITER KEYS GO_FILE``. Says it is ready (a
``ready-WRITER`` file beside GO_FILE), waits for GO_FILE to appear (so that all
writers start together, past their imports), tries to create each of KEYS keys
with its own bytes, and prints the keys it won as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from gm_shell.mailbox import Mailbox, PutOutcome
from gm_shell.oneshot import run_oneshot


async def main(url: str, writer: str, keys: int, go: Path) -> list[str]:
    mailbox = Mailbox.open(url)
    go.with_name(f"ready-{writer}").touch()
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{go} never appeared")
        await asyncio.sleep(0.001)
    names = [f"claims/000000000001/{k:04d}.json" for k in range(keys)]
    outcomes = await asyncio.gather(*(mailbox.put_once(n, writer.encode()) for n in names))
    return [n for n, o in zip(names, outcomes, strict=True) if o is PutOutcome.CREATED]


if __name__ == "__main__":
    url, writer, keys, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    print(json.dumps(run_oneshot(main(url, writer, keys, go))))
