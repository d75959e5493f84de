"""The live progress display: one line per worker, redrawn in place on a terminal.

Theory of operation
-------------------
:func:`render` is a pure function from what the workers have reported to text
lines, so it is tested without a terminal. :class:`LiveDisplay` draws those lines:
on a terminal it moves the cursor up over the previous frame (plain ANSI; no
dependency), elsewhere (a log, CI) it prints a frame only every
``plain_every_s`` so a captured log stays readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TextIO

from gm_shell.demo.progress import WorkerView

BAR_WIDTH = 24


def _bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // max(total, 1)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def _line(name: str, worker: WorkerView, total: int) -> str:
    trained = worker.trained
    step = trained.step if trained else 0
    parts = [f"{name:<10} {_bar(step, total)} {step:>5}/{total}"]
    if trained is not None:
        parts.append(f"loss {trained.loss:6.3f}")
    if worker.evals:
        parts.append(f"eval {worker.evals[-1].loss:6.3f}")
    if trained is not None and trained.round >= 0:
        parts.append(f"round {trained.round}")
    if worker.finished is not None:
        parts.append("done")
    return "  ".join(parts)


def render(header: str, workers: Mapping[str, WorkerView], total: int) -> list[str]:
    """The frame: a header, then each worker's progress bar, step, losses and round."""
    return [header, *(_line(name, view, total) for name, view in workers.items())]


class LiveDisplay:
    def __init__(self, out: TextIO = sys.stdout, plain_every_s: float = 15.0) -> None:
        self._out = out
        self._tty = out.isatty()
        self._plain_every_s = plain_every_s
        self._drawn = 0
        self._last_plain = -float("inf")

    def draw(self, lines: list[str], *, final: bool = False) -> None:
        """Redraw in place on a terminal; elsewhere print now and then, and the final frame."""
        if self._tty:
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            self._out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            self._drawn = len(lines)
        elif final or time.monotonic() - self._last_plain >= self._plain_every_s:
            self._out.write("\n".join(lines) + "\n")
            self._last_plain = time.monotonic()
        self._out.flush()
