"""A one-shot command as the CLI will be: open a mailbox, do some work, exit.

Usage: ``python oneshot_mailbox.py URL OPTIONS_JSON``. It also leaves work
unfinished on purpose (a cancelled request and a task nobody awaits), the way
a command interrupted by an error would. Exits 0 unless something crashed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from gm_shell.mailbox import Mailbox
from gm_shell.oneshot import run_oneshot
from gm_shell.stores import MailboxOptions

LEFT_RUNNING: set[asyncio.Future[str | None]] = set()
"""Tasks nobody awaits: run_oneshot must cancel them and still exit cleanly."""


async def main(url: str, options: MailboxOptions) -> int:
    mailbox = Mailbox.open(url, options=options)
    key = f"exit/{os.getpid()}.json"
    await mailbox.put_once(key, b"{}")
    await mailbox.put("head.json", key.encode())
    await mailbox.get(key)
    await mailbox.probe(key)
    await mailbox.list("exit/")
    cancelled = asyncio.ensure_future(mailbox.get(key))
    await asyncio.sleep(0)
    cancelled.cancel()
    LEFT_RUNNING.add(asyncio.ensure_future(mailbox.probe("head.json")))
    await mailbox.delete([key])
    return 0


if __name__ == "__main__":
    sys.exit(run_oneshot(main(sys.argv[1], MailboxOptions(**json.loads(sys.argv[2])))))
