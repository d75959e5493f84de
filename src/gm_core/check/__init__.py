"""The model checker: exhaustive search over the real protocol machines at small bounds.

Theory of operation
-------------------
:func:`~gm_core.check.explore.explore` enumerates every state of a small
:mod:`gm_core.cluster` — every interleaving of store operations, failures and
lost responses, crashes and restarts, timers and training — breadth first, with
fingerprints (:mod:`gm_core.check.fingerprint`), checking every named invariant
in every state and bounded progress from the states where exploration stops. The
first violation is reported as a shortest trace of
:class:`~gm_core.check.actions.Action` tokens that ``gm check --replay`` re-runs.
"""
