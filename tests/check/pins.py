"""What the exhaustive checks' tests share: a bound set passes and its state count is pinned
(a change detector: a count that moves means the reachable states changed, on purpose or not)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gm_core.check import search
from gm_core.check.bounds import COORDINATION_BOUNDS

B = TypeVar("B")


def check_pinned(
    explore: Callable[[B], search.Outcome[Any]], table: Mapping[str, tuple[B, int]], name: str
) -> None:
    """Explore ``table[name]``'s bounds: no violation, and exactly its pinned state count."""
    bounds, states = table[name]
    outcome = explore(bounds)
    assert outcome.violation == ()
    assert outcome.states == states


def coordination_table(kind: type[B], pins: Mapping[str, int]) -> dict[str, tuple[B, int]]:
    """The ``gm check --ci`` coordination sets of ``kind`` with their pinned state counts; a
    set without a pin gets -1, so its test fails (and says which)."""
    return {
        name: (b, pins.get(name, -1))
        for name, b in COORDINATION_BOUNDS.items()
        if isinstance(b, kind)
    }
