"""gm_shell: the effects around gm_core (mailboxes, payloads, compute backends, Session, CLI)."""

from gm_shell.align import Checkpoint, align
from gm_shell.pacer import StalledError
from gm_shell.run import RunError, RunMismatchError
from gm_shell.session import DiLoCo, DivergedError, Role, Session, SessionOptions

__all__ = [
    "Checkpoint",
    "DiLoCo",
    "DivergedError",
    "Role",
    "RunError",
    "RunMismatchError",
    "Session",
    "SessionOptions",
    "StalledError",
    "align",
]
