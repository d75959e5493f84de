"""Integrations with the tools where training loops already live.

Each module imports its framework when it is imported, so ``gm_shell`` itself
never needs them: :mod:`~gm_shell.integrations.hf` (a ``transformers.Trainer``
callback), :mod:`~gm_shell.integrations.lightning` (a Lightning ``Callback``) and
:mod:`~gm_shell.integrations.metrics` (round metrics to ``logging``,
TensorBoard and Weights & Biases).
"""
