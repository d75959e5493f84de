"""``gm demo``: four learner processes train a character model through a ``file://`` mailbox,
next to a data-parallel baseline on the same tokens (entry point: :mod:`gm_shell.demo.launch`)."""
