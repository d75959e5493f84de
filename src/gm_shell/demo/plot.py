"""The demo's picture: held-out loss against tokens trained, gm next to data-parallel.

Theory of operation
-------------------
All curves share one x axis, tokens trained by all workers together, so equal
x means equal data. A gm curve is the committed model as the launcher found
it in the bucket while the run trained, ending with the final commit. matplotlib
runs headless (Agg), imported only here so the rest of the demo never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from gm_shell.demo.progress import Evaluated


@attrs.frozen(kw_only=True)
class Curve:
    """One line of a plot: its legend label, its points, and a matplotlib format string."""

    label: str
    points: Sequence[Evaluated]
    style: str = "-"
    color: str | None = None
    """A matplotlib color (curves of one run share one); None: the next in the cycle."""


def plot_curves(curves: Sequence[Curve], unigram: float, path: Path, title: str) -> None:
    """Write a PNG of the curves and the unigram entropy for scale (log-scaled loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for curve in curves:
        ax.plot(
            [e.tokens for e in curve.points],
            [e.loss for e in curve.points],
            curve.style,
            color=curve.color,
            label=curve.label,
        )
    ax.axhline(unigram, color="grey", linestyle="--", linewidth=1, label="unigram entropy")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%.1f"))
    ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%.1f"))
    ax.set_xlabel("tokens trained (all workers)")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_losses(
    gm: Sequence[Evaluated],
    baseline: Sequence[Evaluated],
    unigram: float,
    path: Path,
    title: str,
) -> None:
    """The demo's plot: one gm run and its data-parallel baseline."""
    plot_curves(
        [
            Curve(label="data-parallel baseline", points=baseline),
            Curve(label="gm, committed model", points=gm, style=".-"),
        ],
        unigram,
        path,
        title,
    )
