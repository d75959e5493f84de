"""Advice on a run's config: settings that throw away training, and what to set instead.

Theory of operation
-------------------
Some combinations of settings are legal but waste compute in ways a user only
sees later, as a stream of ``zero_steps`` rejections or empty rounds in
``gm status``. :func:`advise` is a pure function from an
:class:`~gm_core.records.AlgorithmConfig` to the :class:`Advice` that applies,
each naming the settings involved, what is wasted, and what to set; the shell
logs it as a warning when it creates a run (the node that chose the config).
Nothing here refuses a config: every combination stays legal, because the
protocol handles it correctly, only wastefully.

The rule, and where its mechanism is stated:

* **Zero-step rounds** (spec/protocol.md §14.2). With ``overwrite`` or
  ``blend``, a learner that runs ``in_flight`` rounds ahead of the commits stalls
  at a due step; when ``in_flight`` is a multiple of ``P`` the commit that
  releases it is for the due round's own fragment, and aligning with it resets
  that fragment's anchor to this very step, so the snapshot it publishes holds
  zero steps and is rejected. ``carry`` (the anchor moves to the snapshot's
  step) or an ``in_flight`` that is not a multiple of ``P`` avoid it. Measured
  in the model cluster: a quarter to half of all snapshots; in ``gm simulate``
  (4 learners, H=20, P=1, in_flight=2, 0.05 s steps, 120 s) 56 ``zero_steps``
  rejections, 6 empty rounds and 50% goodput with ``overwrite``, none and 96.5%
  with ``carry``. ``overlap_steps`` avoids it too but is not advised: with
  ``overlap_steps`` below the gap the learners wait for every commit (3.5%
  goodput in the same simulation).

And one that concerns a node's own options (:func:`advise_node`, logged by every node
as it starts):

* **A fixed grace window that outlasts the stall timeout** (spec/protocol.md §7.5,
  §10.1). A live learner that stops stepping with its session open (waiting at a
  barrier, evaluating) still counts as awaited: a round it has not published stays
  open for the whole ``grace_seconds`` once quorum is reached, so with
  ``grace_seconds >= stall_timeout_s`` its peers' ``step()`` may raise
  ``StalledError`` first (tests/runtime/test_follow_session.py hit it in 1 of ~20
  runs). Close the session before waiting, or keep the window below the timeout.
"""

from __future__ import annotations

import attrs

from gm_core.records import AlgorithmConfig, Alignment


@attrs.frozen(kw_only=True)
class Advice:
    """One wasteful combination: the settings involved, what it costs, what to set."""

    code: str
    """A stable short name (``zero_step_rounds``)."""
    settings: str
    """The settings involved, e.g. ``alignment=overwrite in_flight=2 fragments=1``."""
    waste: str
    fix: str

    def __str__(self) -> str:
        return f"{self.settings}: {self.waste}; {self.fix}"


def advise(config: AlgorithmConfig) -> tuple[Advice, ...]:
    """Every piece of advice that applies to ``config``, in a fixed order (empty: none)."""
    found: list[Advice] = []
    p = config.fragments
    if (
        config.alignment is not Alignment.CARRY
        and config.overlap_steps is None
        and config.in_flight % p == 0
    ):
        other = f", or in_flight={config.in_flight + 1}" if p > 1 else ""
        found.append(
            Advice(
                code="zero_step_rounds",
                settings=(
                    f"alignment={config.alignment.value} in_flight={config.in_flight}"
                    f" fragments={p} overlap_steps=None"
                ),
                waste=(
                    "whenever commits lag training by a round, a learner's next snapshot of"
                    " that fragment holds zero steps and is rejected (zero_steps), and the"
                    " steps it trained since its previous snapshot are lost"
                ),
                fix=f"set alignment='carry'{other}",
            )
        )
    return tuple(found)


def advise_node(config: AlgorithmConfig, stall_timeout_s: float) -> tuple[Advice, ...]:
    """Advice on ``config`` together with this node's ``stall_timeout_s`` (empty: none)."""
    grace_s = config.grace_seconds
    if grace_s is None or grace_s < stall_timeout_s:
        return ()
    return (
        Advice(
            code="grace_outlasts_stall",
            settings=f"grace_seconds={grace_s:g} stall_timeout_s={stall_timeout_s:g}",
            waste=(
                "a learner that stops stepping with its session open holds each round it"
                " has not published open for the whole grace window, and this node's"
                " step() raises StalledError before that window ends"
            ),
            fix=f"close() a session before waiting, or set grace_seconds below {stall_timeout_s:g}",
        ),
    )
