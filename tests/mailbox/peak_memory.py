"""A process's resident memory and its peak, from ``/proc/self/status`` (Linux).

The peak (VmHWM) can be started afresh at the memory resident now (``clear_refs`` 5), so
that a figure covers only what a process did after a warm-up.
"""

from __future__ import annotations

import re


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        found = re.search(rf"{field}:\s+(\d+) kB", status.read())
    assert found is not None, field
    return int(found.group(1))


def rss_bytes() -> int:
    """Resident memory now (VmRSS)."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Peak resident memory since the process began or the last :func:`reset_peak` (VmHWM)."""
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Start the peak afresh at the memory resident now."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
