"""Where a demo run keeps its files: one folder per run, named so processes agree on paths.

Theory of operation
-------------------
``runs/<name>/`` holds ``spec.json`` (what to train), ``mailbox/`` (the gm
bucket, through ``file://``), ``progress/<worker>.jsonl`` (one per process),
``logs/<worker>.log`` (each process's stderr), and the results:
``loss.png`` and ``summary.json``; ``ready/<worker>`` marks a learner that is
ready to join. Every process derives its paths from the
run folder alone.
"""

from __future__ import annotations

from pathlib import Path

from gm_shell.demo import spec as spec_module
from gm_shell.demo.spec import DemoSpec

BASELINE = "baseline"


def learner_name(index: int) -> str:
    return f"learner-{index}"


class RunDir:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @property
    def spec_path(self) -> Path:
        return self.root / "spec.json"

    @property
    def mailbox_path(self) -> Path:
        return self.root / "mailbox"

    @property
    def mailbox_url(self) -> str:
        return self.mailbox_path.as_uri()

    @property
    def plot_path(self) -> Path:
        return self.root / "loss.png"

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.json"

    def progress(self, worker: str) -> Path:
        return self.root / "progress" / f"{worker}.jsonl"

    def ready(self, worker: str) -> Path:
        """Touched by a learner once it is built and about to join (the start barrier)."""
        return self.root / "ready" / worker

    def log(self, worker: str) -> Path:
        return self.root / "logs" / f"{worker}.log"

    def load_spec(self) -> DemoSpec:
        return spec_module.load(self.spec_path)
