"""gm_shell: the effects around gm_core (mailboxes, payloads, compute backends, Session, CLI)."""

from gm_core.records import Alignment, Compression, MergeRule, Partition, Reason, WireFormat
from gm_shell.align import Checkpoint, align
from gm_shell.barrier import Barrier, BarrierMismatchError, BarrierTimeoutError
from gm_shell.finished import RunFinishedError
from gm_shell.jax_model import JaxParams
from gm_shell.members import RevokedError
from gm_shell.nodekeys import NodeKeyError
from gm_shell.pacer import StalledError
from gm_shell.queue import QueueMismatchError, SharedQueue
from gm_shell.ranks import RankLost, RanksDoneError
from gm_shell.resume import ResumeError
from gm_shell.run import ManifestPinError, NotDescendedError, RunError, RunMismatchError
from gm_shell.runkey import OpenRunWarning, RunKeyError, keygen
from gm_shell.session import DiLoCo, DivergedError, Role, Session, SessionOptions
from gm_shell.stores import MailboxOptions

__all__ = [
    "Alignment",
    "Barrier",
    "BarrierMismatchError",
    "BarrierTimeoutError",
    "Checkpoint",
    "Compression",
    "DiLoCo",
    "DivergedError",
    "JaxParams",
    "MailboxOptions",
    "ManifestPinError",
    "MergeRule",
    "NodeKeyError",
    "NotDescendedError",
    "OpenRunWarning",
    "Partition",
    "QueueMismatchError",
    "RankLost",
    "RanksDoneError",
    "Reason",
    "ResumeError",
    "RevokedError",
    "Role",
    "RunError",
    "RunFinishedError",
    "RunKeyError",
    "RunMismatchError",
    "Session",
    "SessionOptions",
    "SharedQueue",
    "StalledError",
    "WireFormat",
    "align",
    "keygen",
]
