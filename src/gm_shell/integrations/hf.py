"""A ``transformers.Trainer`` callback that makes the Trainer's process one node of a gm run.

Theory of operation
-------------------
::

    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[GmTrainerCallback(DiLoCo(sync_every=100), mailbox=url)])
    trainer.train()

The Trainer owns the loop; the callback owns a :class:`~gm_shell.Session`
around it. ``on_train_begin`` enters the session with the Trainer's model (the
first node creates the run, the others join and start from the newest commit);
``on_step_end``, which the Trainer calls after each optimizer and scheduler
step, counts that step with the samples it trained (per-device batch size times
the devices of this process times gradient accumulation); ``on_train_end``
closes the session, so the model is left at the newest commit. Commits are
folded into the model's parameters in place between steps, which the
optimizer and the scheduler do not notice. One process is one learner.
"""

from __future__ import annotations

from typing import Any

from gm_shell.extras import require

require("GmTrainerCallback", ("transformers", "torch"), extra="hf")

from transformers import TrainerCallback  # noqa: E402 (after the extra check)

from gm_shell.session import DiLoCo, Session  # noqa: E402


class GmTrainerCallback(TrainerCallback):
    """Joins the Trainer's training to a gm run.

    Args:
        algorithm: the run's :class:`~gm_shell.DiLoCo` settings.
        mailbox: the run's URL (``s3://bucket/run``, ``file:///path``...).
        **session: any other :class:`~gm_shell.Session` argument (``node``,
            ``options``, ``mailbox_options``, ``callbacks``...).
    """

    def __init__(self, algorithm: DiLoCo, mailbox: str, **session: Any) -> None:
        self.algorithm = algorithm
        self.mailbox = mailbox
        self.session_kwargs = session
        self.session: Session | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs["model"]
        self.session = Session(
            model, algorithm=self.algorithm, mailbox=self.mailbox, **self.session_kwargs
        )
        self.session.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self.session.step(samples=args.train_batch_size * args.gradient_accumulation_steps)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self.session.close()
