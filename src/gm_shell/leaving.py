"""Leaving on any exit: a process that stops training releases its lease, however it stops.

Theory of operation
-------------------
Peers judge a learner alive while its lease keeps changing, and wait for a live
learner's snapshot before they close a round (up to ``lease_timeout_s``). A node
that exits without deleting its lease therefore costs every peer one lease
timeout. ``with Session(...)`` covers the exits that pass through its block; this
module covers the rest, for every session still open in the process:

- an exception that escapes a training loop with no ``with`` block (a Trainer
  callback, a notebook cell) ends the interpreter, and so does returning from
  ``main`` without ``close()``: at interpreter exit each open session *leaves*;
- SIGTERM (what schedulers and ``kill`` send) is turned into ``SystemExit(143)``
  in the main thread, so the training loop unwinds through ``with`` blocks and
  ``finally`` clauses like any exception, and whatever stays open leaves at
  exit. The handler is installed only where SIGTERM still has its default
  action (a handler the program set is its own business), and with no session
  open it dies exactly as the default action would.

A process that supervises learner processes (the demo's launcher) holds no lease
itself, but SIGTERM's default action would kill it before it stops them: they
would train on, holding their leases, with nobody left to wait for them.
:func:`sigterm_raises` makes SIGTERM unwind such a process through its
``finally`` clauses too, where it terminates its children (which then leave).

Leaving (``Session._leave``) is the quick half of closing: no final flush, no
waiting for commits, only "stop the machines, then delete the lease".

The exit hook runs from ``threading``'s exit hooks, not ``atexit``: those run
before Python joins the worker threads of thread pools (after which no pool
accepts work), and they also run when a ``multiprocessing`` child exits, where
``atexit`` does not. SIGKILL and power loss cannot be caught; the lease timeout
is what covers them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

LOG = logging.getLogger("gm")

EXIT_ON_SIGTERM = 128 + signal.SIGTERM
"""The exit status a shell reports for a process ended by SIGTERM."""


class Leaver(Protocol):
    def _leave(self) -> None: ...


_open: set[Leaver] = set()
"""Strong references: a session dropped without ``close()`` still holds its lease."""
_lock = threading.Lock()
_hooked = False


def opened(session: Leaver) -> None:
    """``session`` holds a lease from now on: make sure it leaves at any exit."""
    global _hooked
    with _lock:
        _open.add(session)
        if not _hooked:
            _hooked = True
            _register_exit_hook()
    _catch_sigterm()


def closed(session: Leaver) -> None:
    """``session`` released its lease (or never wrote one)."""
    with _lock:
        _open.discard(session)


def leave_all() -> None:
    """Leave every session still open (the interpreter is exiting)."""
    with _lock:
        sessions = list(_open)
    for session in sessions:
        try:
            session._leave()
        except Exception as error:  # one session's failure must not keep the others' leases
            LOG.warning("gm: leaving at exit failed: %s: %s", type(error).__name__, error)


def _register_exit_hook() -> None:
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(leave_all)
            return
    except RuntimeError:  # the interpreter is already shutting down threads
        pass
    atexit.register(leave_all)


def _catch_sigterm() -> None:
    """Install the SIGTERM handler, from the main thread only, over the default action only."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``SystemExit(143)`` in the main thread, open
    sessions or not (a second one takes the default action); the handler before is
    put back after. As with sessions, only over the default action or this module's
    own handler, and only from the main thread (elsewhere: no change)."""
    previous = signal.getsignal(signal.SIGTERM)
    ours = previous in (signal.SIG_DFL, _on_sigterm)
    if not ours or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(EXIT_ON_SIGTERM)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # A second SIGTERM (or one with nothing to leave) takes the default action at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with _lock:
        anyone = bool(_open)
    if not anyone:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise SystemExit(EXIT_ON_SIGTERM)
