"""The demo's picture: held-out loss against tokens trained, gm next to data-parallel.

Theory of operation
-------------------
Both curves share one x axis, tokens trained by all workers together, so equal
x means equal data. The gm curve is the committed model as the launcher found
it in the bucket while the run trained, ending with the final commit. matplotlib
runs headless (Agg), imported only here so the rest of the demo never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gm_shell.demo.progress import Evaluated


def plot_losses(
    gm: Sequence[Evaluated],
    baseline: Sequence[Evaluated],
    unigram: float,
    path: Path,
    title: str,
) -> None:
    """Write a PNG of both curves and the unigram entropy for scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    ax.plot(
        [e.tokens for e in baseline], [e.loss for e in baseline], label="data-parallel baseline"
    )
    ax.plot([e.tokens for e in gm], [e.loss for e in gm], ".-", label="gm, committed model")
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
