"""Argument types for the ``gm`` command line: a bad value is a usage error, not a traceback.

Theory of operation
-------------------
argparse turns an ``ArgumentTypeError`` raised by a ``type=`` function into
``gm <command>: error: argument --flag: <message>`` and exit status 2, before
any handler runs; so every check that needs only the value itself lives here and
nothing (a run folder, a mailbox, a process) exists yet when a value is refused.
Checks that relate two values are the handlers' (see :func:`usage_error`).
:func:`progress_wanted` is the one rule for progress output: a live line only
on a terminal unless asked for, so a redirected log holds no ``\\r`` lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

USAGE = 2
"""Exit status of a command line that cannot be run as given (argparse's own)."""


def _parse(text: str, kind: type[int] | type[float], low: float, strict: bool) -> float:
    word = "an integer" if kind is int else "a number"
    bound = f"> {low:g}" if strict else f">= {low:g}"
    try:
        value = kind(text)
    except ValueError:
        value = None
    # NaN compares false with everything, so it fails the range test too.
    if value is None or not (value > low if strict else value >= low):
        raise argparse.ArgumentTypeError(f"expected {word} {bound}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (learners, steps, H, P, quorum, in_flight, bounds)."""
    return int(_parse(text, int, 1, strict=False))


def non_negative_int(text: str) -> int:
    """An integer >= 0 (overlap steps, crashes, faults)."""
    return int(_parse(text, int, 0, strict=False))


def positive_float(text: str) -> float:
    """A number > 0 (durations, intervals)."""
    return _parse(text, float, 0, strict=True)


def non_negative_float(text: str) -> float:
    """A number >= 0 (rates, shares, learning rates)."""
    return _parse(text, float, 0, strict=False)


def existing_file(text: str) -> Path:
    """A path to a file that exists (a scenario to load)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def usage_error(command: str, message: str) -> int:
    """Print a usage error the way argparse does and return its exit status."""
    print(f"gm {command}: error: {message}", file=sys.stderr)
    return USAGE


def progress_wanted(args: argparse.Namespace, stream: TextIO = sys.stderr) -> bool:
    """Live progress: when asked (``--progress``), else on a terminal unless ``--quiet``."""
    if getattr(args, "progress", False):
        return True
    return not getattr(args, "quiet", False) and stream.isatty()


def add_progress_flags(p: argparse.ArgumentParser) -> None:
    """``--progress`` and ``--quiet``, shared by every command that shows progress."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--progress", action="store_true", help="show progress even when stderr is not a terminal"
    )
    group.add_argument("--quiet", action="store_true", help="no progress, even on a terminal")
