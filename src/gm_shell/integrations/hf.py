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
the devices of this process times gradient accumulation) and, when the Trainer
counts them (``include_num_input_tokens_seen``), the tokens: a run of
``DiLoCo(unit="tokens")`` needs that setting (the callback refuses to start
without it); ``on_train_end``
closes the session, so the model is left at the newest commit. Commits are
folded into the model's parameters in place between steps, which the
optimizer and the scheduler do not notice. One process is one learner.

With ``resume=True`` (and a fixed ``node`` id) the Trainer's optimizer, LR
scheduler and step counts (``state.global_step``, ``num_input_tokens_seen``) are
the node's resume state (:mod:`gm_shell.resume`), with the parameters' local
progress: a node restarted with the same id continues at its saved step, so
``max_steps`` counts the steps it trained before, and its optimizer, schedule and
parameters are where they were. A mapping instead of ``True`` adds its entries to
that state and receives the restored plain values.

The data position. The Trainer fast-forwards its data loader only when it
resumes from a checkpoint folder (``train(resume_from_checkpoint=...)``): it
reads ``global_step`` from the folder's ``trainer_state.json`` before any
callback runs, starts at epoch ``global_step // steps per epoch`` and skips that
epoch's first ``global_step % steps per epoch`` batches (times gradient
accumulation; its sampler's seeded order, so these are exactly the batches
trained before). From its own checkpoints (``save_steps``) it also restores the
model, optimizer, scheduler and RNG states, but only as fresh as the last
checkpoint. :meth:`GmTrainerCallback.trainer_checkpoint` writes such a folder
from the node's state in the bucket instead: the step counts of its last save
and the model's weights (which the session replaces by the newest commit plus
the saved progress when training begins; the optimizer and scheduler come from
the bucket then too). So ``trainer.train(resume_from_checkpoint=
callback.trainer_checkpoint(trainer))`` continues the data where the saved step
left it, with everything else as ``resume=True`` restores it.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gm_shell.extras import require

require("GmTrainerCallback", ("transformers", "torch"), extra="hf")

from transformers import TrainerCallback, TrainerState  # noqa: E402 (after the extra check)

from gm_core.records import Unit  # noqa: E402
from gm_shell.resume import read_saved  # noqa: E402
from gm_shell.runkey import FROM_ENV  # noqa: E402
from gm_shell.session import DiLoCo, Session  # noqa: E402

CHECKPOINT = "gm-resume-{node}"
"""The folder, under the Trainer's ``output_dir``, that :meth:`trainer_checkpoint` writes."""


def _counts(args: Any) -> bool:
    """Whether the Trainer counts input tokens (``include_num_input_tokens_seen``)."""
    return args.include_num_input_tokens_seen not in (False, None, "no")


class GmTrainerCallback(TrainerCallback):
    """Joins the Trainer's training to a gm run.

    Args:
        algorithm: the run's :class:`~gm_shell.DiLoCo` settings.
        mailbox: the run's URL (``s3://bucket/run``, ``file:///path``...).
        resume: ``True`` to resume this node exactly after a restart with the same
            ``node`` id (optimizer, LR scheduler, step counts); a mapping adds its
            entries to that state (see :class:`~gm_shell.Session`).
        **session: any other :class:`~gm_shell.Session` argument (``node``,
            ``options``, ``mailbox_options``, ``callbacks``...).
    """

    def __init__(
        self,
        algorithm: DiLoCo,
        mailbox: str,
        *,
        resume: bool | MutableMapping[str, Any] = False,
        **session: Any,
    ) -> None:
        self.algorithm = algorithm
        self.mailbox = mailbox
        self.resume = resume
        self.session_kwargs = session
        self.session: Session | None = None
        self._tokens_seen = 0

    def trainer_checkpoint(self, trainer: Any) -> str | None:
        """A checkpoint folder for ``trainer.train(resume_from_checkpoint=...)`` that makes
        the Trainer skip the batches this node trained before its last resume save; None if
        the bucket holds no saved state of this node (start afresh: pass None on).

        Needs ``resume=`` and a fixed ``node``. The folder (``output_dir/gm-resume-NODE``,
        rewritten each time) holds the Trainer's model as it is now and a
        ``trainer_state.json`` with the saved ``global_step`` and tokens seen: no optimizer,
        scheduler or RNG files, which the session restores from the bucket instead.
        """
        node = self.session_kwargs.get("node")
        if self.resume is False or node is None:
            raise ValueError("trainer_checkpoint() needs GmTrainerCallback(resume=..., node=...)")
        saved = read_saved(
            self.mailbox,
            node,
            run_key=self.session_kwargs.get("run_key", FROM_ENV),
            options=self.session_kwargs.get("mailbox_options"),
        )
        progress = None if saved is None else saved.values.get("trainer.progress")
        if not isinstance(progress, dict):
            return None
        folder = Path(trainer.args.output_dir) / CHECKPOINT.format(node=node)
        trainer.save_model(str(folder))
        args = trainer.args
        TrainerState(
            global_step=int(progress["global_step"]),
            num_input_tokens_seen=int(progress["num_input_tokens_seen"]),
            logging_steps=args.logging_steps,
            eval_steps=args.eval_steps,
            save_steps=args.save_steps,
            train_batch_size=args.per_device_train_batch_size,
        ).save_to_json(str(folder / "trainer_state.json"))
        return str(folder)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.algorithm.unit is Unit.TOKENS and not _counts(args):
            raise ValueError(
                "DiLoCo(unit='tokens') counts tokens: set TrainingArguments("
                "include_num_input_tokens_seen=True) so the Trainer counts them"
            )
        model = kwargs["model"]
        resume = _resume_state(state, kwargs, self.resume) if self.resume is not False else None
        self.session = Session(
            model,
            algorithm=self.algorithm,
            mailbox=self.mailbox,
            resume=resume,
            **self.session_kwargs,
        )
        self.session.start()  # restores the resume state: global_step goes on from it
        self._tokens_seen = state.num_input_tokens_seen

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            seen = state.num_input_tokens_seen
            tokens = seen - self._tokens_seen if _counts(args) else None
            self._tokens_seen = seen
            self.session.step(
                samples=args.train_batch_size * args.gradient_accumulation_steps, tokens=tokens
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self.session.close()


class _Progress:
    """The Trainer's step counts, saved and restored through ``state_dict()``.

    ``TrainerState`` has no such methods; the Trainer's loop reads ``global_step`` at
    every step (``max_steps`` stops it), so setting it before the first step is enough.
    """

    def __init__(self, state: Any) -> None:
        self.state = state

    def state_dict(self) -> dict[str, int]:
        return {
            "global_step": int(self.state.global_step),
            "num_input_tokens_seen": int(self.state.num_input_tokens_seen),
        }

    def load_state_dict(self, saved: dict[str, int]) -> None:
        self.state.global_step = int(saved["global_step"])
        self.state.num_input_tokens_seen = int(saved["num_input_tokens_seen"])


def _resume_state(
    state: Any, handed: dict[str, Any], extra: bool | MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The Trainer's own training state, as ``Session(resume=...)`` entries (``trainer.*``),
    added to the user's mapping when there is one (so its plain values are restored there)."""
    resume: MutableMapping[str, Any] = {} if isinstance(extra, bool) else extra
    resume["trainer.progress"] = _Progress(state)
    for name in ("optimizer", "lr_scheduler"):
        if handed.get(name) is not None:
            resume[f"trainer.{name}"] = handed[name]
    return resume
