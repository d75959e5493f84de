"""gm_shell.allocator: with the fixed mmap threshold, a freed fragment leaves the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gm_shell.allocator import _glibc, fix_mmap_threshold, malloc_figures

FREES = textwrap.dedent(
    """
    import sys
    import numpy as np
    from gm_shell.allocator import fix_mmap_threshold

    def rss():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:")) * 1024

    assert fix_mmap_threshold(1 << 20)
    held = []
    before = rss()
    for _ in range(8):  # as a closer's rounds: a fragment decoded, small objects kept, freed
        big = np.ones(16 << 20, dtype=np.uint8)
        held.append(bytearray(4096))  # above the big buffer where the heap would have it
        del big
    print(rss() - before)
    """
)


@pytest.mark.skipif(_glibc() is None, reason="the C allocator is not glibc's")
def test_a_freed_fragment_leaves_the_process() -> None:
    """Eight 16 MiB buffers, each freed under a small one kept: the resident memory grows
    by far less than one of them (glibc's own rule keeps them from the second one on)."""
    out = subprocess.run([sys.executable, "-c", FREES], capture_output=True, text=True, check=True)
    assert int(out.stdout) < 4 << 20, out.stdout


@pytest.mark.parametrize("threshold", [0, -1, (32 << 20) + 1])
def test_a_threshold_glibc_would_refuse_is_refused_by_name(threshold: int) -> None:
    with pytest.raises(ValueError, match="mmap threshold"):
        fix_mmap_threshold(threshold)


@pytest.mark.skipif(not malloc_figures(), reason="the C allocator is not glibc 2.33+")
def test_malloc_figures_count_a_buffer_while_it_is_held() -> None:
    """What bench_memory reads: bytes in use (heap or mapped) grow by a buffer held, and
    shrink back when it is freed."""
    before = malloc_figures()
    held = bytearray(8 << 20)
    during = malloc_figures()
    del held
    after = malloc_figures()

    def in_use(figures: dict[str, int]) -> int:
        return figures["heap_used"] + figures["mapped"]

    assert in_use(during) - in_use(before) >= 8 << 20
    assert in_use(during) - in_use(after) >= 8 << 20
