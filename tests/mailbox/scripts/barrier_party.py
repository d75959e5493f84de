"""One party of a barrier, as a separate process: wait ``WAITS`` times, print each outcome.

Usage: ``python barrier_party.py URL OPTIONS_JSON NAME PARTY PARTIES WAITS TIMEOUT_S``.
Prints one JSON line per wait (``{"released": generation, "members": [...]}`` or
``{"timed_out": generation, "arrived": [...], "by": party}``) and exits 0; a timeout
ends the waits. Any other failure exits non-zero with its traceback.
"""

from __future__ import annotations

import json
import sys

from gm_shell import Barrier, BarrierTimeoutError
from gm_shell.stores import MailboxOptions


def main(argv: list[str]) -> int:
    url, options, name, party, parties, waits, timeout_s = argv
    with Barrier(
        name,
        parties=int(parties),
        mailbox=url,
        party=party,
        timeout_s=float(timeout_s),
        poll_s=0.2,
        mailbox_options=MailboxOptions(**json.loads(options)),
    ) as gate:
        for _ in range(int(waits)):
            try:
                members = gate.wait()
            except BarrierTimeoutError as error:
                line = {"timed_out": error.generation, "arrived": list(error.arrived)}
                print(json.dumps({**line, "by": error.by, "message": str(error)}), flush=True)
                return 0
            print(json.dumps({"released": gate.generation, "members": list(members)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
