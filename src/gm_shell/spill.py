"""Deltas a closer keeps on its local disk until their merge, read back a block at a time.

Why
---
A closer holds every delta of a round from the moment it judged it (its ``Verify``) to
the round's merge: with one fragment as big as the model, each remote learner's delta is
a model's bytes in memory beside the anchor, the momentum and the merge's output, and a
closer's memory grows with the number of learners. Yet gm_core's merges read a delta only
a block of values at a time (``delta[lo:hi]``, at most :data:`~gm_core.numerics.blocks.BLOCK`
values: the weighted sum, the trimmed means, RDA's norms, the cosine and the screen's
spread), so a delta need not be in memory to be merged.

A payload of a fragment at least :attr:`Spill.above` bytes, in gm's bare F32 format (the
values after the header: compression ``none``), is streamed as its body arrives into an
unlinked file in :attr:`Spill.directory`, hashed on the way, and judged there (its digest,
then its values finite, read back a block at a time): a :class:`Spilled` stands for it,
which the merge reads by blocks (``os.pread``, into one block buffer). The file is the
node's own, made after the object was read: what the merge reads is what was judged,
whatever the bucket holds by then. It goes with its last reference (the file is unlinked
from the start: nothing is left behind by a crash). A disk write of each delta's bytes,
and reads of them back (mostly from the page cache), are the cost, against its bytes of
memory (bench/README.md, "Spilled deltas").
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import IO, Final

import attrs
import numpy as np

from gm_core.numerics.arrays import F32
from gm_core.numerics.blocks import BLOCK, blocks

SPILL_ABOVE: Final = 8 << 20
"""A fragment whose values take this many bytes or more is spilled by default. Measured
(bench/README.md, "Spilled deltas"): at 16 MiB spilling saves each delta's bytes for 21%
more read time and 25% more merge time; at 6 MiB it cost no time, but in a live run of a
48 MiB model in 8 fragments it took nothing off the peak (set there by several fragments'
commits and payloads at once), so small fragments stay in memory."""
WRITE_SIZE: Final = 1 << 20
"""What is written to a spill file at a time."""


@attrs.frozen(kw_only=True)
class Spill:
    """Where and from what size a node spills the deltas it merges."""

    directory: str | None = None
    """None: the system's temporary directory (``tempfile.gettempdir()``). On a RAM-backed
    ``tmpfs`` a spilled delta is in memory still (the page cache's, not the process's):
    name a directory on disk."""
    above: int = SPILL_ABOVE

    def applies(self, size: int) -> bool:
        """Whether a delta of ``size`` bytes of values is spilled: big enough, with twice
        its bytes free in the directory (else it is held in memory, as below the size)."""
        if size < self.above:
            return False
        directory = self.directory or tempfile.gettempdir()
        try:
            return shutil.disk_usage(directory).free > 2 * size
        except OSError:
            return False

    def file(self) -> IO[bytes]:
        """A new file, unlinked already, for one delta's values."""
        return tempfile.TemporaryFile(dir=self.directory, buffering=0)


class _Flags:
    """What :func:`~gm_core.numerics.arrays.check_flat` asks of a buffer's flags."""

    c_contiguous: Final = True
    writeable: Final = False


class Spilled:
    """A judged fp32 delta of ``n`` values in a file of its own, read a block at a time.

    It answers what a merge asks of a flat delta (``dtype``, ``shape``, ``flags``,
    ``nbytes``, ``delta[lo:hi]``): a slice of at most a block is read into one buffer,
    reused (so a slice is good until the next one is taken: one thread reads it at a
    time, the merge's), a longer one into a fresh array. It is never written: a merge
    makes its output elsewhere."""

    dtype: Final = np.dtype(np.float32)
    flags: Final = _Flags()

    def __init__(self, file: IO[bytes], n: int) -> None:
        self._file = file
        self._n = n
        self._block = np.empty(min(BLOCK, n), dtype=np.float32)

    @property
    def shape(self) -> tuple[int]:
        return (self._n,)

    @property
    def nbytes(self) -> int:
        """The values' bytes (on disk: a cache counts them against its bound all the same)."""
        return 4 * self._n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, span: slice) -> F32:
        lo, hi, step = span.indices(self._n)
        assert step == 1, "a spilled delta is read by contiguous spans"
        count = max(hi - lo, 0)
        out = self._block[:count] if count <= self._block.shape[0] else np.empty(count, np.float32)
        view = out.view(np.uint8).data
        done = 0
        while done < view.nbytes:  # a read may return fewer bytes than asked
            got = os.pread(self._file.fileno(), view.nbytes - done, 4 * lo + done)
            if not got:
                raise OSError(f"spill file ended at byte {4 * lo + done} of {4 * self._n}")
            view[done : done + len(got)] = got
            done += len(got)
        return out

    def all_finite(self) -> bool:
        """Whether every value is finite (read back a block at a time)."""
        return all(bool(np.isfinite(self[lo:hi]).all()) for lo, hi in blocks(0, self._n))

    def close(self) -> None:
        self._file.close()


def write_values(file: IO[bytes], read: Callable[[int], memoryview]) -> int:
    """Write what ``read`` gives (at most its argument's bytes a call, until it gives none)
    into ``file``: the bytes written."""
    written = 0
    while chunk := read(WRITE_SIZE):
        done = 0
        while done < len(chunk):  # an unbuffered write may take fewer bytes than given
            done += file.write(chunk[done:]) or 0
        written += done
    return written
