"""The demo's verdict: one table of protocol, cost and loss figures, also saved as JSON.

Theory of operation
-------------------
Everything a user needs to judge the run in one place, each figure from the
source that can vouch for it: rounds, participants and merged tokens from the
tape (:mod:`gm_shell.demo.tape`); requests from the learners' own mailbox
counters (what each node asked of the bucket, priced at S3 list prices); losses
from held-out evaluation of the committed model and of the baseline. Goodput is
the share of the learners' training tokens that reached a commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import cattrs

from gm_shell.accounting import PRICES_S3, Stats, cost_usd
from gm_shell.demo.spec import DemoSpec
from gm_shell.demo.tape import TapeFigures


@attrs.frozen(kw_only=True)
class LearnerTotals:
    """What the learners report of themselves, summed over them."""

    tokens: int = 0
    compute_s: float = 0.0
    """Inside optimizer steps."""
    wall_s: float = 0.0
    """From joining to the end of closing."""
    requests: Stats = attrs.field(factory=Stats)


@attrs.frozen(kw_only=True)
class Summary:
    spec: DemoSpec
    wall_s: float
    tape: TapeFigures
    learners: LearnerTotals
    gm_loss: float
    """Held-out loss of the newest committed model after every learner closed."""
    baseline_loss: float
    unigram_loss: float

    @property
    def trained_tokens(self) -> int:
        return self.learners.tokens

    @property
    def requests(self) -> Stats:
        return self.learners.requests

    @property
    def goodput(self) -> float:
        return self.tape.merged_tokens / self.trained_tokens if self.trained_tokens else 0.0

    @property
    def training_share(self) -> float:
        """Share of the learners' session time spent in optimizer steps (the rest: waiting
        on the protocol, joining, flushing, and the Session's own work)."""
        return self.learners.compute_s / self.learners.wall_s if self.learners.wall_s else 0.0

    @property
    def cost_usd(self) -> float:
        return cost_usd(self.requests, PRICES_S3)

    @property
    def loss_ratio(self) -> float:
        return self.gm_loss / self.baseline_loss


def _rows(s: Summary) -> list[tuple[str, str]]:
    gm, r, t = s.spec.gm, s.requests, s.tape
    per_round = max(t.rounds, 1)
    return [
        ("learners × steps", f"{s.spec.learners} × {s.spec.steps}  ({s.trained_tokens:,} tokens)"),
        (
            "H, P, quorum, outer lr, mom.",
            f"{gm.sync_every}, {gm.fragments}, {s.spec.quorum}, {gm.outer_lr}, "
            f"{gm.outer_momentum}  ({gm.alignment}, deltas {gm.delta_format})",
        ),
        ("rounds", f"{t.rounds}  (takeovers {t.takeovers}, rejections {t.rejections})"),
        (
            "participants per round",
            f"{t.participants_mean:.2f} mean, {t.participants_min} min"
            f"  ({len(t.learners)} learners)",
        ),
        ("goodput", f"{s.goodput:.1%} of trained tokens reached a commit"),
        ("learner time training", f"{s.training_share:.1%} (the rest: waits, join, flush)"),
        (
            "store requests",
            f"{r.total_requests:,}  (LIST {r.list_requests:,}, GET "
            f"{r.get_requests:,}, PUT {r.put_requests:,}, DELETE {r.delete_requests:,})",
        ),
        ("requests per round", f"{r.total_requests / per_round:.1f}"),
        (
            "S3 request cost",
            f"${s.cost_usd:.4f}  (${s.cost_usd / per_round * 1e3:.3f} per 1000 rounds)",
        ),
        (
            "final eval loss",
            f"gm {s.gm_loss:.4f}  ·  data-parallel {s.baseline_loss:.4f}"
            f"  ·  unigram {s.unigram_loss:.4f} nats",
        ),
        ("gm / data-parallel", f"{s.loss_ratio:.4f}  (target ≤ 1.05)"),
        ("wall time", f"{s.wall_s:.0f} s"),
    ]


def table(summary: Summary) -> str:
    """The summary as aligned text lines."""
    rows = _rows(summary)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def save(summary: Summary, path: Path) -> None:
    """The summary's fields and derived figures as JSON (for the README and the bench)."""
    body = cattrs.Converter().unstructure(summary)
    body.update(
        goodput=summary.goodput,
        training_share=summary.training_share,
        cost_usd=summary.cost_usd,
        loss_ratio=summary.loss_ratio,
    )
    path.write_text(json.dumps(body, indent=2) + "\n")
