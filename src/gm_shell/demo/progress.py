"""Progress files: how the demo's worker processes tell the launcher what they are doing.

Theory of operation
-------------------
Each worker process (a learner or the baseline) appends one JSON object per
line to its own file under ``<run>/progress/``; the launcher re-reads the files
to draw the live display and, at the end, the plot and the table. A file per
writer and append-only lines need no locks and survive a crash: the reader
ignores a torn last line. Lines are tagged values (``kind``) of the attrs
classes below, decoded strictly with cattrs.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any, TypeAlias

import attrs
import cattrs


@attrs.frozen(kw_only=True)
class Trained:
    """A worker's position: steps done, the last batch loss, seconds since it started, and
    (for a gm learner) the newest round whose commit it has folded in."""

    step: int
    loss: float
    elapsed_s: float
    round: int = -1


@attrs.frozen(kw_only=True)
class Evaluated:
    """Held-out loss after ``tokens`` tokens trained by all workers together."""

    step: int
    tokens: int
    loss: float


@attrs.frozen(kw_only=True)
class Noted:
    """Something that happened to a worker (a gm event, by its name)."""

    name: str
    detail: str = ""


@attrs.frozen(kw_only=True)
class Finished:
    """A worker's totals when it exits cleanly.

    ``compute_s`` is time inside the optimizer steps; ``wall_s`` is time from the
    first step to the end of the session (for a learner: waiting and flushing
    included). ``requests`` are the mailbox's counters as ``Stats`` fields.
    """

    steps: int
    tokens: int
    compute_s: float
    wall_s: float
    requests: dict[str, int] = attrs.field(factory=dict)


Line: TypeAlias = Trained | Evaluated | Noted | Finished
_KINDS: dict[str, type[Line]] = {
    "trained": Trained,
    "evaluated": Evaluated,
    "noted": Noted,
    "finished": Finished,
}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


class ProgressWriter:
    """Appends lines to one worker's progress file, flushed so readers see them at once.

    Thread-safe: a learner writes from its training thread and from the session's
    event-callback thread, and a line must never interleave with another.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, line: Line) -> None:
        body: dict[str, Any] = {"kind": _KIND_OF[type(line)], **_CONVERTER.unstructure(line)}
        text = json.dumps(body) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_line(text: str) -> Line:
    body = json.loads(text)
    cls = _KINDS[body.pop("kind")]
    return _CONVERTER.structure(body, cls)


def read_lines(path: Path) -> list[Line]:
    """Every complete line of a progress file (none if it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    complete = text.split("\n")[:-1]  # the part after the last newline may be torn
    return [decode_line(line) for line in complete if line]


@attrs.frozen(kw_only=True)
class WorkerView:
    """What the launcher knows of one worker, folded from its lines."""

    trained: Trained | None
    evals: tuple[Evaluated, ...]
    notes: tuple[Noted, ...]
    finished: Finished | None


def view(lines: list[Line]) -> WorkerView:
    trained = [line for line in lines if isinstance(line, Trained)]
    finished = [line for line in lines if isinstance(line, Finished)]
    return WorkerView(
        trained=trained[-1] if trained else None,
        evals=tuple(line for line in lines if isinstance(line, Evaluated)),
        notes=tuple(line for line in lines if isinstance(line, Noted)),
        finished=finished[-1] if finished else None,
    )
