"""The one way a one-shot command (the CLI, an example, a script) runs async gm code.

Theory of operation
-------------------
Symptom: a short script that used obstore's *async* API and then returned
aborted with SIGABRT at interpreter exit in about one run in five, after its
work was done (exit code 134, no Python traceback).

Cause, from a native backtrace of the abort: obstore completes each async call
on a tokio thread that enters Python to hand the result to the event loop
(``pyo3_async_runtimes::set_result`` → ``loop.call_soon_threadsafe`` →
``_write_to_self`` → ``socket.send``). ``socket.send`` releases the GIL for the
syscall; meanwhile the main thread runs the callback, finishes ``main()``,
closes the loop and starts ``Py_FinalizeEx``. When the tokio thread comes back
for the GIL, CPython (3.11–3.13) sees the interpreter finalizing and ends the
thread with ``pthread_exit``; the forced unwind meets Rust frames that may not
unwind, and the process aborts. Nothing the script awaits can close that
window: the result has already been delivered when the thread is still in it.
The sync API, pytest (whose process lives on) and a sleep before exit only hide
it by timing.

Fix, by construction rather than timing: :class:`~gm_shell.mailbox.Mailbox`
calls obstore's *synchronous* API on worker threads that Python itself created
(a ``ThreadPoolExecutor``), so no foreign thread ever enters the interpreter.
Python joins those threads before it finalizes, and :func:`run_oneshot` makes
that explicit and bounded: it runs the coroutine on a fresh loop, lets asyncio
cancel leftovers and join its default executor, closes every mailbox still
open (each waits only for requests already in flight, each bounded by the
request timeout), and flushes stdio. Code that reaches obstore only through
``Mailbox`` therefore exits cleanly with or without this function; with it,
the exit is also prompt and ordered. ``os._exit`` is not needed and not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from gm_shell.mailbox import close_all

T = TypeVar("T")


def run_oneshot(main: Coroutine[Any, Any, T], *, debug: bool = False) -> T:
    """Run ``main`` to completion on a fresh event loop, then shut down in order.

    Returns what ``main`` returns and raises what it raises; cleanup happens
    either way.
    """
    try:
        with asyncio.Runner(debug=debug) as runner:
            return runner.run(main)
    finally:
        close_all()
        for stream in (sys.stdout, sys.stderr):
            # A closed or broken pipe is the reader's business, not a crash.
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
