"""Read hostile objects through a node's Reader; print each verdict, bytes received and RSS.

Run as a fresh interpreter: ``hostile_reads.py URL OPTIONS_JSON CASES_JSON``. Growth
is the peak resident memory (VmHWM, reset after a warm-up of the manifest and sound
payload reads, so thread pools and the store client are in the baseline) minus the
memory resident at that reset; the peak only grows from there, so each figure covers
every case before it. Every case
is read twice: the second read shows what remembering by ETag saves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gm_core import codec
from gm_core.records import Manifest, PayloadRef
from gm_shell import events
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.mailbox import Mailbox
from gm_shell.reads import Reader
from gm_shell.stores import MailboxOptions

sys.path.insert(0, str(Path(__file__).parents[1]))
from peak_memory import peak_rss_bytes, reset_peak

KEPT: list[object] = []
"""Objects the control case read, held until the end (as a reader holding them would)."""


async def main(url: str, options: MailboxOptions, cases: list[dict[str, Any]]) -> None:
    seen: list[events.Event] = []
    with Mailbox.open(url, options=options) as mailbox:

        async def compute(fn: Any, *args: Any) -> Any:
            return await asyncio.to_thread(fn, *args)

        got = await mailbox.get("manifest.json")
        assert got is not None
        manifest = codec.decode(Manifest, got.data)
        fragments = FragmentCodec(manifest)
        reader = Reader(
            node="reader",
            mailbox=mailbox,
            codec=fragments,
            compute=compute,
            emit=seen.append,
            clock=lambda: 0.0,
        )
        for state in manifest.init:  # warm-up: sound reads of every initial theta
            await reader.payload(manifest.init.index(state), Role.THETA, state.theta)
        reset_peak()
        baseline = peak_rss_bytes()
        results = []
        for case in cases:
            for attempt in (1, 2):
                received = mailbox.stats.bytes_in
                refused = sum(isinstance(e, events.Refused) for e in seen)
                verdict = await read(reader, mailbox, case)
                results.append(
                    {
                        "name": case["name"],
                        "attempt": attempt,
                        "verdict": verdict,
                        "received": mailbox.stats.bytes_in - received,
                        "refused_events": sum(isinstance(e, events.Refused) for e in seen)
                        - refused,
                        "peak_growth": peak_rss_bytes() - baseline,
                    }
                )
    print(json.dumps(results))


async def read(reader: Reader, mailbox: Mailbox, case: dict[str, Any]) -> str:
    if case["kind"] == "control":  # what an uncapped read of the same object costs
        got = await mailbox.get(case["key"])
        KEPT.append(got)
        return "read"
    if case["kind"] == "json":
        got = await reader.json(case["key"])
        return "absent" if got is None else got.refused or "read"
    ref = PayloadRef(**case["ref"])
    try:
        await reader.payload(case["fragment"], Role(case["role"]), ref)
    except UnusablePayloadError as error:
        return str(error)
    return "sound"


if __name__ == "__main__":
    asyncio.run(
        main(sys.argv[1], MailboxOptions(**json.loads(sys.argv[2])), json.loads(sys.argv[3]))
    )
