"""One asyncio event loop on a thread of its own, and the two ways other threads reach it.

Theory of operation
-------------------
A session's protocol state lives on one event loop, so that exactly one thread
ever calls the core's ``advance``. The training thread (and ``__enter__`` /
``close``) reach that loop in two ways only:

- :meth:`LoopThread.poster` makes a function that schedules a callback and
  returns at once (the training thread left notes for the loop, see
  :mod:`gm_shell.pacer`). It hands the callback to a small forwarding thread,
  one that never preempts the thread that wakes it, through a queue, because
  waking the loop directly (``call_soon_threadsafe``) writes to a socket, which
  releases the GIL: the loop thread, or any other, may take it and keep the
  caller waiting for as long as its Python work lasts. A queue's ``put`` wakes
  the forwarder without letting go of the GIL; the forwarder then wakes the
  loop on its own time. Posted callbacks run in order, but not in order with
  :meth:`call` and :meth:`run`;
- :meth:`LoopThread.call` runs a callback or coroutine on the loop and waits for
  its result (reporting a step and learning the core's reply; setup; close).
  Waiting is bounded and notices a loop that died, so a caller never hangs on
  a loop that will not answer.

The thread is a daemon: a process that exits without closing its sessions is
not held hostage by it (the mailbox's own worker threads are joined by Python
at exit, see :mod:`gm_shell.oneshot`). :meth:`stop` lets every pending task end
(bounded), then stops and closes the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._posts: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._forwarder = threading.Thread(target=self._forward, name=f"{name}-post", daemon=True)
        self._forwarder.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def poster(self, callback: Callable[[], None]) -> Callable[[], None]:
        """A function that has ``callback`` run on the loop soon; it never blocks and never
        lets go of the GIL (a queue's ``put``, called directly: no Python frame)."""
        return functools.partial(self._posts.put, callback)

    def _forward(self) -> None:
        _yield_to_everyone()
        while (callback := self._posts.get()) is not None:
            if self.alive:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    self.loop.call_soon_threadsafe(callback)

    def call(self, callback: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run ``callback`` on the loop and return its result (or raise its exception)."""
        if not self.alive:
            raise RuntimeError("the session's event loop has stopped")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(callback())
            except BaseException as error:
                future.set_exception(error)

        self.loop.call_soon_threadsafe(run)
        return self._wait(future, timeout_s)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return self.result(self.begin(coroutine), timeout_s)

    def begin(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop without waiting (:meth:`result` waits for it)."""
        if not self.alive:
            coroutine.close()
            raise RuntimeError("the session's event loop has stopped")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def result(self, future: concurrent.futures.Future[T], timeout_s: float | None = None) -> T:
        """The result of a coroutine :meth:`begin` started, once it is there."""
        return self._wait(future, timeout_s)

    def _wait(self, future: concurrent.futures.Future[T], timeout_s: float | None) -> T:
        """The result, checking every second that the loop is still there to produce it."""
        waited = 0.0
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                waited += 1.0
                if not self.alive:
                    raise RuntimeError("the session's event loop stopped") from None
                if timeout_s is not None and waited >= timeout_s:
                    future.cancel()
                    raise TimeoutError(f"no answer from the event loop in {timeout_s} s") from None

    def stop(self, grace_s: float = 5.0) -> None:
        """Let pending tasks finish for up to ``grace_s``, cancel the rest, stop the loop."""
        self._posts.put(None)  # the forwarder ends once it has passed on the posts before it
        if not self.alive:
            return
        if not self.on_loop():
            self._forwarder.join(timeout=grace_s)
            with contextlib.suppress(RuntimeError, TimeoutError):
                self.run(_drain(grace_s), timeout_s=grace_s + 5.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=grace_s + 5.0)
        if not self._thread.is_alive():
            self.loop.close()


def _yield_to_everyone() -> None:
    """Make the calling thread (the forwarder) one that never preempts another when woken.

    Waking a sleeping thread lets the kernel switch to it at once, away from the waker; the
    waker — the training thread at a due step — then waits for a CPU while it holds the
    GIL, which the woken thread wants first: on 2 loaded cores, a ``put`` that wakes a
    normal forwarder took 1.5-12 ms at the p99, one that wakes a ``SCHED_IDLE`` forwarder
    ~50 us, and the posts reached the loop as soon (median ~170 us either way; see
    ``bench/README.md``). Linux only; elsewhere the forwarder keeps its priority. (A
    ``SCHED_IDLE`` thread still runs on a busy machine, with the smallest share: a post it
    is slow to pass on waits at most until the learner's next feed, which takes the notes.)
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))


async def _drain(grace_s: float) -> None:
    me = asyncio.current_task()
    tasks: set[asyncio.Task[Any]] = {t for t in asyncio.all_tasks() if t is not me}
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
