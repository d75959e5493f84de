"""A Lightning ``Callback`` that makes a ``Trainer.fit`` one node of a gm run.

Theory of operation
-------------------
::

    trainer = L.Trainer(max_steps=10_000,
                        callbacks=[GmCallback(DiLoCo(sync_every=100), mailbox=url)])
    trainer.fit(module, loader)

``on_fit_start`` enters a :class:`~gm_shell.Session` with the LightningModule
(the first node creates the run, the others join from the newest commit).
Lightning calls ``on_train_batch_end`` after every batch, but steps the
optimizer only every ``accumulate_grad_batches`` batches; the callback counts
a gm step whenever ``trainer.global_step`` has moved, with the samples of the
batches since (their first dimension, or ``samples_per_step`` when given).
``on_fit_end`` closes the session, leaving the module at the newest commit.
One process is one learner.
"""

from __future__ import annotations

from typing import Any

from gm_shell.extras import require

require("GmCallback", ("lightning", "torch"), extra="lightning")

import lightning.pytorch as pl  # noqa: E402 (after the extra check)

from gm_shell.session import DiLoCo, Session  # noqa: E402


def batch_samples(batch: Any) -> int:
    """The first dimension of a batch's first tensor (tuples, lists and dicts searched)."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, list | tuple) or isinstance(batch, dict):
        for item in items:
            found = batch_samples(item)
            if found:
                return found
    return 0


class GmCallback(pl.Callback):
    """Joins a Lightning ``Trainer.fit`` to a gm run.

    Args:
        algorithm: the run's :class:`~gm_shell.DiLoCo` settings.
        mailbox: the run's URL.
        samples_per_step: samples one optimizer step trains on; default: counted
            from the batches (their first dimension).
        **session: any other :class:`~gm_shell.Session` argument.
    """

    def __init__(
        self,
        algorithm: DiLoCo,
        mailbox: str,
        samples_per_step: int | None = None,
        **session: Any,
    ) -> None:
        self.algorithm = algorithm
        self.mailbox = mailbox
        self.samples_per_step = samples_per_step
        self.session_kwargs = session
        self.session: Session | None = None
        self._counted_step = 0
        self._samples = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session = Session(
            pl_module, algorithm=self.algorithm, mailbox=self.mailbox, **self.session_kwargs
        )
        self.session.start()
        self._counted_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += batch_samples(batch)
        if self.session is None:
            return
        while self._counted_step < trainer.global_step:
            self._counted_step += 1
            self.session.step(samples=self.samples_per_step or max(self._samples, 1))
            self._samples = 0

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session is not None:
            self.session.close()
