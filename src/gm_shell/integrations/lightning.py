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
batches since (their first dimension, or ``samples_per_step`` when given) and,
in a run of ``DiLoCo(unit="tokens")``, their tokens (:func:`batch_tokens`, or
``tokens_per_step`` / ``count_tokens`` when given).
``on_fit_end`` closes the session, leaving the module at the newest commit;
``on_exception`` (``fit`` failing) makes it leave at once instead, releasing its
lease. One process is one learner.

With ``resume=True`` (and a fixed ``node`` id) the Trainer's optimizers, LR
schedulers and fit-loop state are the node's resume state
(:mod:`gm_shell.resume`): a node restarted with the same id continues at its
saved step, with ``trainer.global_step`` (so ``max_steps`` counts the steps
already trained), its epoch and the optimizers' and schedulers' state where they
were. A mapping instead of ``True`` adds its entries to that state, and receives
the restored plain values.

The data position. The fit-loop state is what Lightning's own checkpoints keep
under ``loops``: the epoch and batch progress and the ``state_dict()`` of every
training data loader that has ``state_dict()``/``load_state_dict()`` (Lightning's
way to resume within an epoch; ``torchdata``'s ``StatefulDataLoader`` is one).
Restoring it in ``on_fit_start`` (where Lightning restores a ``ckpt_path``'s
loops: before the fit loop sets up its data) makes the fit loop restart as from
such a checkpoint: it hands the loaders their saved states, so a stateful loader
goes on with the batch after the last one trained, and the epoch goes on with
the sampler's epoch (``set_epoch``). A loader without a state restarts its epoch
at the beginning (Lightning warns). The state is noted before the session counts
each optimizer step (at ``on_train_batch_end``, where Lightning's
``ModelCheckpoint`` saves too), and a save hands out the newest note: the state
after ``fit`` returns, which a closing save would otherwise take, marks the
interrupted epoch as finished.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from gm_shell.extras import require

require("GmCallback", ("lightning", "torch"), extra="lightning")

import lightning.pytorch as pl  # noqa: E402 (after the extra check)

from gm_core.records import Unit  # noqa: E402
from gm_shell.session import DiLoCo, Session  # noqa: E402


def batch_samples(batch: Any) -> int:
    """The first dimension of a batch's first tensor (tuples, lists and dicts searched)."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    return _first_inside(batch, batch_samples)


def batch_tokens(batch: Any) -> int:
    """The tokens of a language-model batch: the ones its ``attention_mask`` keeps, else
    every element of its ``input_ids``, else of its first tensor (``[batch, sequence]``)."""
    if isinstance(batch, dict):
        mask = batch.get("attention_mask")
        if mask is not None:
            return int(mask.sum())
        ids = batch.get("input_ids")
        if ids is not None:
            return int(ids.numel())
    if hasattr(batch, "numel"):
        return int(batch.numel())
    return _first_inside(batch, batch_tokens)


def _first_inside(batch: Any, count: Callable[[Any], int]) -> int:
    """The first non-zero ``count`` of the items of a tuple, list or dict batch (0: none)."""
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, list | tuple) or isinstance(batch, dict):
        for item in items:
            found = count(item)
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
        tokens_per_step: in a run of ``DiLoCo(unit="tokens")``, the tokens one
            optimizer step trains on; default: counted from the batches.
        count_tokens: in a tokens run, the tokens of one batch (default
            :func:`batch_tokens`); ignored when ``tokens_per_step`` is given.
        resume: ``True`` to resume this node exactly after a restart with the same
            ``node`` id (optimizers, LR schedulers, the fit loop's step, epoch and
            stateful data loaders' positions); a mapping adds its entries to that
            state (see :class:`~gm_shell.Session`).
        **session: any other :class:`~gm_shell.Session` argument.
    """

    def __init__(
        self,
        algorithm: DiLoCo,
        mailbox: str,
        samples_per_step: int | None = None,
        *,
        tokens_per_step: int | None = None,
        count_tokens: Callable[[Any], int] = batch_tokens,
        resume: bool | MutableMapping[str, Any] = False,
        **session: Any,
    ) -> None:
        self.algorithm = algorithm
        self.mailbox = mailbox
        self.samples_per_step = samples_per_step
        self.tokens_per_step = tokens_per_step
        self.count_tokens = count_tokens
        self.resume = resume
        self.session_kwargs = session
        self.session: Session | None = None
        self._counted_step = 0
        self._samples = 0
        self._tokens = 0
        self._fit_loop: _FitLoop | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        state = None
        if self.resume is not False:
            self._fit_loop = _FitLoop(trainer.fit_loop)
            state = _resume_state(trainer, self._fit_loop, self.resume)
        self.session = Session(
            pl_module,
            algorithm=self.algorithm,
            mailbox=self.mailbox,
            resume=state,
            **self.session_kwargs,
        )
        self.session.start()  # restores the resume state: global_step goes on from it
        self._counted_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += batch_samples(batch)
        if self.algorithm.unit is Unit.TOKENS and self.tokens_per_step is None:
            self._tokens += self.count_tokens(batch)
        if self.session is None:
            return
        if self._fit_loop is not None and self._counted_step < trainer.global_step:
            self._fit_loop.note()  # before step(), which may save
        while self._counted_step < trainer.global_step:
            self._counted_step += 1
            self.session.step(
                samples=self.samples_per_step or max(self._samples, 1),
                tokens=self.tokens_per_step or self._tokens,
            )
            self._samples = self._tokens = 0

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session is not None:
            self.session.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """``fit`` is failing (an exception, KeyboardInterrupt, SIGTERM's exit): the session
        leaves at once, as an exception escaping its ``with`` block makes it, so peers do
        not wait a lease timeout for this node."""
        if self.session is not None:
            self.session.__exit__(type(exception), exception, exception.__traceback__)


class _FitLoop:
    """Lightning's fit-loop state for the resume state, as of the last optimizer step.

    ``state_dict()`` hands out the state noted last (:meth:`note`), else the restored
    one, else the live one (a save on joining, before any batch).
    """

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.noted: dict[str, Any] | None = None

    def note(self) -> None:
        self.noted = self.loop.state_dict()

    def state_dict(self) -> dict[str, Any]:
        return self.noted if self.noted is not None else self.loop.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loop.load_state_dict(state)
        self.noted = state  # the loaders' states wait in the loop until it sets up its data


def _resume_state(
    trainer: Any, fit_loop: _FitLoop, extra: bool | MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The Trainer's own training state, as ``Session(resume=...)`` entries (``lightning.*``),
    added to the user's mapping when there is one (so its plain values are restored there).

    The fit loop's state holds the optimizer-step progress, Lightning's own record of
    ``global_step`` (so a restored node's ``max_steps`` counts the steps it trained
    before), the epoch and the data loaders' positions.
    """
    state: MutableMapping[str, Any] = {} if isinstance(extra, bool) else extra
    state["lightning.fit_loop"] = fit_loop
    for i, optimizer in enumerate(trainer.optimizers):
        state[f"lightning.optimizer.{i}"] = optimizer
    for i, config in enumerate(trainer.lr_scheduler_configs):
        state[f"lightning.scheduler.{i}"] = config.scheduler
    return state
