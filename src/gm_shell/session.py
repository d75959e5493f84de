"""``Session``: a few lines in a training loop make this process one node of a DiLoCo run.

Theory of operation
-------------------
::

    with Session(model, algorithm=DiLoCo(sync_every=100, fragments=4), mailbox=url) as s:
        for batch in data:
            loss(model, batch).backward(); opt.step(); opt.zero_grad()
            s.step(samples=len(batch))

Entering the session opens the mailbox, creates the run or adopts the one there
(:mod:`gm_shell.run`), starts the runtime's event loop (:mod:`gm_shell.runtime`)
and, for a learner, waits until the newest committed parameters are in the
model. ``step()`` after each optimizer step is an increment and a compare until
the core's next barrier (:mod:`gm_shell.pacer`); there it copies a fragment
when a round is due (the loop told it beforehand which one, so it does not wait
for the loop), folds in commits that have arrived, and blocks only where
``in_flight`` / ``overlap_steps`` say so, raising :class:`StalledError` if the
run makes no progress for ``stall_timeout_s``. Closing flushes this learner's
last deltas (``flush_on_close``), waits for its rounds in flight (bounded),
releases its lease, stops the closer, and leaves the model at the newest commit.
An exception escaping the ``with`` block, SIGTERM, or an interpreter exit with
the session still open makes it *leave* instead: stop at once and delete the
lease, so peers do not wait a lease timeout for it (:mod:`gm_shell.leaving`).

The model belongs to the training thread: its parameters are read and written
only inside ``start()``, ``step()`` and ``close()``, on the thread that calls
them, between optimizer steps. The session's event loop and worker threads
never touch them; they get copies (see :mod:`gm_shell.pacer`). So ``step()``
and ``close()`` must be called from the thread that trains.

Roles: ``both`` (the default: learner and closer-capable), ``learner``, ``closer``
(no training loop; it never creates the run: it waits for a learner to, and a model
given to it only checks the run's schema; :meth:`Session.serve` returns once the run is
finished; while its lease is live on the committer's clock, each record names it the next
round's closer, :func:`gm_core.election.next_closer`) and ``either`` (trains a
:class:`SharedQueue` like ``both`` until the run elects it its closer: it leads a round
while another learner is live and no dedicated closer is, :func:`gm_core.election.serves`;
it then trains its unit to the end, gives back the units it claimed and has not started,
closes its learner without a done marker, and closes rounds until the run is finished).
A learner and a closer of one node share its lease key, so only the learner writes it
(an elected ``either`` node's closer takes it over: the learner closes without deleting it).
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from types import TracebackType
from typing import Any

import attrs

from gm_core import batch as core_batch
from gm_core import closer as core_closer
from gm_core import finish, keys, liveness, tip
from gm_core import learner as core_learner
from gm_core import resume as core_resume
from gm_core.advice import advise, advise_node
from gm_core.auth import RunAuth, of_run
from gm_core.completion import DoneMarker, Plain, Queued, Ranked, Shape, encode_done
from gm_core.events import Started
from gm_core.manifest import digest as manifest_digest
from gm_core.manifest import natural_format, wire_wider_than_params
from gm_core.records import (
    EMBEDDING_PATTERN,
    AlgorithmConfig,
    Alignment,
    Compression,
    Manifest,
    MergeRule,
    Partition,
    Roster,
    RoundRecord,
    TensorSpec,
    Unit,
    WireFormat,
)
from gm_core.tape import chain_digest
from gm_shell import drift, events, leaving, members
from gm_shell.accounting import PRICES_S3, PriceTable, Stats, cost_usd
from gm_shell.align import Checkpoint, load_frontier, newest_record
from gm_shell.allocator import fix_mmap_threshold
from gm_shell.barrier import Barrier
from gm_shell.finished import (
    RunFinishedError,
    believed,
    describe,
    fetch_finished,
    read_finished,
)
from gm_shell.fragments import FragmentCodec, compute_backend, payload_key
from gm_shell.group import AUTO
from gm_shell.group import resolve as resolve_group
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.models import ModelAdapter, adapt, framework
from gm_shell.nodekeys import (
    NodeKey,
    NodeKeyError,
    RosterArg,
    reader,
    resolve_node_key,
    resolve_roster,
    roles_of,
    signing_for,
    with_signing,
)
from gm_shell.pacer import Pacer, StalledError
from gm_shell.queue import Consumer, SharedQueue, drive, log_rejections
from gm_shell.ranks import RankHolder
from gm_shell.reads import fetch_head
from gm_shell.replica import Replica
from gm_shell.resume import Progress, Resumer, Saved, default_max_bytes
from gm_shell.resume import digest_key as resume_digest_key
from gm_shell.run import (
    NotDescendedError,
    RunError,
    adopt,
    create,
    draft_manifest,
    pinned_digest,
    read_manifest,
)
from gm_shell.runkey import FROM_ENV, OpenRunWarning, RunKey, open_run_warning
from gm_shell.runkey import resolve as resolve_run_key
from gm_shell.runtime import Machine, Runtime, lease_epoch_us, now
from gm_shell.spill import SPILL_ABOVE, Spill
from gm_shell.stores import MailboxOptions
from gm_shell.tapereads import read_record

__all__ = ["DiLoCo", "Role", "Session", "SessionOptions", "StalledError", "WireWidthWarning"]


def _wire_format(value: WireFormat | str | None) -> WireFormat | None:
    return None if value is None else WireFormat(value)


class Role(enum.StrEnum):
    """What a node does: ``both`` (train, and close rounds when elected), ``learner``
    (train only), ``closer`` (close rounds only, preferred as leader while live; no
    training loop) or ``either`` (train a shared queue until elected closer, then close)."""

    BOTH = "both"
    LEARNER = "learner"
    CLOSER = "closer"
    EITHER = "either"


@attrs.frozen(kw_only=True)
class DiLoCo:
    """The algorithm every node of a run agrees on (plus ``flush_on_close``, a node's own).

    The first node writes these settings into the run's manifest; a node started
    later with different ones is refused with an error naming the difference. The
    guide "Choosing the settings" in ``docs/`` says how to pick them.

    Attributes:
        sync_every: ``H``, local steps between two syncs of the same fragment. Each
            learner publishes a fragment's delta every ``H/P`` steps.
        fragments: ``P``, how many fragments the parameters are split into
            (Streaming DiLoCo); one round syncs one fragment. 1 syncs everything at once.
        quorum: accepted snapshots a round waits for before its grace window; the
            closer never waits for a learner whose lease has lapsed.
        in_flight: rounds a learner may publish ahead of the newest commit it has
            aligned with before ``step()`` waits.
        overlap_steps: if set, ``step()`` waits once it is this many steps past a
            published round whose commit has not arrived (bounds staleness; costs waits).
        alignment: how a learner folds a commit into its model: ``carry`` (the
            default: the commit plus the steps trained since the snapshot), ``overwrite``
            (the commit replaces the fragment; those steps are dropped), ``blend``, or
            ``adaptive`` (per fragment: carry while the learners' deltas agree, overwrite
            while they do not, judged by the mean pairwise cosine every commit records).
        carry_above: with ``adaptive``, a fragment carries from a commit whose cosine is at
            least this on (the reference package's ``Adaptive(carry_above=)``).
        overwrite_below: with ``adaptive``, a fragment overwrites from a commit whose cosine
            is below this on; in between it keeps what it did, and every fragment starts by
            carrying. ``-1 <= overwrite_below <= carry_above <= 1``.
        follow: a learner that has not reached a round's step yet publishes the round at
            once, with the steps it has, once the closer has accepted this many other
            learners' snapshots in it (at most the other live learners): slow learners keep
            the run's pace instead of holding rounds open. 0 (the default) never does; the
            reference package's default is ``quorum - 1``. Costs a slow learner one GET
            per poll while it waits for a round, and the closer one PUT per round.
        mixing: with ``blend``, the weight of the commit (1.0 behaves as overwrite).
        merge: how a closer combines accepted deltas: ``mean`` (weighted by
            tokens²/steps), ``rda`` (mean norm times mean direction), or, against
            hostile or broken learners, ``trimmed_mean`` or ``median`` (coordinate-wise:
            each coordinate's extreme values are dropped by count, the rest weighted by
            tokens²/steps; see the guide's "Robust merges").
        trim_fraction: with ``trimmed_mean``, the share of deltas dropped at each end of
            every coordinate (at least one of three or more, never all).
        clip_norm_factor: if set, a delta longer than this many times the round's
            median delta norm is scaled down to that length before merging.
        outlier_norm_factor: if set, a delta longer than this many times the round's
            median delta norm is rejected (``outlier`` on the tape; rounds of 3 or more
            deltas, never a majority of them).
        outlier_cosine: if set, a delta whose cosine to the round's coordinate-wise
            median is below this (0.0: it points away) is rejected as ``outlier``.
        outer_lr: Nesterov outer learning rate η.
        outer_momentum: Nesterov outer momentum β (0 disables momentum).
        partition: how tensors are dealt into fragments: ``bytes`` (balanced by size)
            or ``strided`` (blocks round-robin).
        delta_format: wire format of a learner's delta: ``F32``, ``F16``, ``BF16``,
            ``F8_E4M3`` or ``F4_E2M1`` (quantized with power-of-two scales).
        commit_format: wire format of a commit's change from the previous version
            (``F32`` publishes full fragments only).
        compression: byte compression of payloads: ``none`` or ``zstd``.
        global_batch_size: if set, :attr:`Session.batch_size` is this divided among
            the learners the newest commit's closer saw live (exact shares, see there).
        flush_on_close: publish the steps trained since the last snapshot when the
            session closes (a node's own choice, not part of the run's config).
        embedding_pattern: tensors whose name contains this are merged by plain
            weighted mean even under ``rda``.
        grace_gamma: γ of the adaptive grace window after quorum (0 closes at quorum).
        grace_seconds: a fixed grace window after quorum instead, in seconds (what the
            reference package's ``grace_seconds`` does); None: adaptive.
        lease_timeout_s: a learner whose lease has not changed for this long is
            treated as gone (rounds stop waiting for it).
        takeover_floor_s: the least a follower waits for the next record before it
            claims the round from a silent closer.
        unit: what ``step()`` counts: ``samples`` (``step(samples=n)``) or ``tokens``
            (``step(tokens=n)``); it weighs the deltas and ``gm status`` reports it.
        max_share: no learner's share of a merge exceeds this many times an equal
            share (``1/n`` of ``n`` merged): a learner's weight comes from the counts it
            reports, so one that claims absurd counts takes at most this much (with 2
            learners nothing is capped, with 4 at most half, with 8 a quarter); the
            excess goes to the others in proportion. ``None`` caps nothing.
    """

    sync_every: int
    fragments: int = 1
    quorum: int = 1
    in_flight: int = 2
    overlap_steps: int | None = None
    alignment: Alignment = attrs.field(default=Alignment.CARRY, converter=Alignment)
    mixing: float = 1.0
    merge: MergeRule = attrs.field(default=MergeRule.MEAN, converter=MergeRule)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    partition: Partition = attrs.field(default=Partition.BYTES, converter=Partition)
    delta_format: WireFormat | None = attrs.field(default=None, converter=_wire_format)
    """None: the run's when joining; when creating, what the model's parameters hold
    (BF16 for an all-bf16 model, F16 for all-fp16, else F32; see ``natural_format``)."""
    commit_format: WireFormat | None = attrs.field(default=None, converter=_wire_format)
    compression: Compression = attrs.field(default=Compression.NONE, converter=Compression)
    global_batch_size: int | None = None
    flush_on_close: bool = True
    embedding_pattern: str = EMBEDDING_PATTERN
    grace_gamma: float = 0.5
    grace_seconds: float | None = None
    carry_above: float = 0.6
    overwrite_below: float = 0.4
    follow: int = 0
    lease_timeout_s: float = 30.0
    takeover_floor_s: float = 10.0
    unit: Unit = attrs.field(default=Unit.SAMPLES, converter=Unit)
    max_share: float | None = 2.0
    trim_fraction: float = 0.25
    clip_norm_factor: float | None = None
    outlier_norm_factor: float | None = None
    outlier_cosine: float | None = None
    sync_filter: str | None = None
    """Which parameters the run synchronizes: None, the trainable ones (``requires_grad``;
    a LoRA model's adapters); else those whose name this regular expression matches. The
    others are frozen: pinned by digest in the manifest, checked at join, never shipped."""

    def config(
        self, held: tuple[TensorSpec, ...] = (), run: AlgorithmConfig | None = None
    ) -> AlgorithmConfig:
        """The agreed config; wire formats left None are the run's, else natural to ``held``."""
        fields = attrs.asdict(self, recurse=False)
        del fields["flush_on_close"], fields["sync_filter"]
        for name in ("delta_format", "commit_format"):
            if fields[name] is None:
                fields[name] = getattr(run, name) if run is not None else natural_format(held)
        return AlgorithmConfig(**fields)


@attrs.frozen(kw_only=True)
class SessionOptions:
    """How this node behaves (not part of the run's agreed config).

    Attributes:
        poll_s: the finest polling interval: used when an object is due (sparser
            while it is not).
        renew_s: lease renewal interval; ``None``: half the run's ``lease_timeout_s``.
        close_timeout_s: how long closing waits for this learner's rounds in flight.
        stall_timeout_s: ``step()`` raises :class:`StalledError` after waiting this
            long without progress (no closer, an unreachable bucket).
        join_timeout_s: how long entering the session waits for the newest commit.
        compute: merge backend: ``auto`` (torch on the CUDA device if there is one, else
            torch on CPU if installed, else numpy), ``torch`` (CPU) or ``numpy``. With
            torch on an accelerator, a closer decodes, merges and encodes its payloads
            there (on CPU it decodes and encodes with numpy, torch merging the host arrays).
        cache_bytes: memory for payloads this node keeps to avoid downloading them again,
            for each of its three caches (commits, deltas, momentum; with torch on an
            accelerator, a closer's deltas and momentum are kept there); None: the newest
            commit and momentum of every fragment (the model's bytes, fp32, each: an
            older one read again is downloaded again), 1 GiB for the deltas of rounds not
            merged yet (a merge drops its own).
        mmap_threshold: with glibc, the size from which every buffer gets its own mapping,
            returned to the system when freed (:mod:`gm_shell.allocator`; set for the whole
            process when the session starts); None (the default): the C allocator is left
            as it is.
        max_sweep_rounds: rounds of garbage a closer sweeps per commit, at most.
    """

    poll_s: float = 1.0
    """The finest polling interval: used when an object is due (sparser while it is not)."""
    renew_s: float | None = None
    """Lease renewal interval; None: half the run's ``lease_timeout_s``."""
    close_timeout_s: float = 60.0
    stall_timeout_s: float = 600.0
    join_timeout_s: float = 300.0
    compute: str = "auto"
    """Merge backend: ``auto`` (torch on CUDA or MPS if there is one, else torch on CPU if
    installed, else numpy; numpy for an MLX or JAX model, which never imports torch for its
    merges), ``torch`` (CPU) or ``numpy``."""
    cache_bytes: int | None = None
    mmap_threshold: int | None = None
    """E.g. 1 MiB: a fragment's buffers are freed to the system, not kept in a fragmented
    heap (with a 16 MiB model, a closer-learner grew 194-219 MiB with it against 366-430,
    a learner 109-135 against 221-252: spec/threat-model.md §4.9). Off by default: every
    buffer of a fragment is then faulted in afresh (the closer's codec work on a 16 MiB
    fragment took +98% CPU a round, median, at load 6-11: bench/README.md, "Memory")."""
    spill_above: int | None = SPILL_ABOVE
    """A closer reads the deltas of a fragment whose values take this many bytes or more
    (8 MiB by default) into files on local disk, not memory, and merges them from there a
    block at a time (:mod:`gm_shell.spill`; payloads in gm's bare F32 format, compression
    ``none``): its memory then grows with neither the fragment's size times the learners
    nor the learners' number. None: every delta is held in memory until its merge."""
    spill_dir: str | None = None
    """Where spilled deltas go (unlinked files); None: the system's temporary directory,
    which on a RAM-backed ``tmpfs`` saves no memory: name a directory on disk there."""
    max_sweep_rounds: int = 4
    max_divergences: int = 2
    """Non-finite rejections in a row (each followed by a reload) before ``step()`` raises
    :class:`DivergedError`."""
    resume_every_rounds: int | None = None
    """With ``Session(resume=...)``: rounds of commits between two saves of this node's resume
    state; None: the run's ``fragments`` (one save per ``sync_every`` steps)."""
    resume_max_bytes: int | None = None
    """With ``Session(resume=...)``: the largest resume state this node saves or reads back (a
    bigger object in the bucket is refused unread); None: 16 bytes per synchronized parameter
    plus 64 MiB."""
    members_poll_s: float = members.POLL_S
    """With per-node keys: seconds between two looks at ``members/`` for the run authority's
    certificates and revocations (spec/protocol.md §16.3.3)."""


class WireWidthWarning(UserWarning):
    """The run's wire format is wider than this learner's parameters (bytes for nothing)."""


class LeftError(RuntimeError):
    """The session left the run (an exception, SIGTERM or exit): its machines stopped."""


def default_node_id() -> str:
    """``host-pid``, reduced to the id alphabet the bucket layout accepts."""
    raw = f"{socket.gethostname()}-{os.getpid()}"
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", raw).strip(".-_")[: keys.ID_MAX_CHARS]
    return cleaned if keys.valid_id(cleaned) else f"node-{uuid.uuid4().hex[:12]}"


MAX_DESCENT_ROUNDS = 4096
"""The most rounds a resumed node reads back to check its tape's descent (one GET each)."""
LEAVING_GIVE_BACK_S = 10.0
"""How long a node leaving :meth:`Session.run` with an error tries to give its queue's
unstarted units back before it leaves them to be re-issued after its lease times out."""


def _named(manifest: Manifest, mailbox: Mailbox) -> str:
    """A run event's detail: where the run is and the manifest digest that pins it."""
    return f"{mailbox.url} manifest {manifest_digest(manifest)}"


class DivergedError(RuntimeError):
    """This learner's deltas were rejected as non-finite by several commits in a row,
    although its model was reloaded each time: training itself produces NaN or Inf."""


class Session:
    """One node of a run: learner and/or closer, over one mailbox.

    Use it as a context manager around the training loop and call :meth:`step`
    after every optimizer step. Entering creates the run (the first node) or
    joins it from the newest commit; leaving flushes this learner's last deltas,
    waits (bounded) for its rounds and leaves the model at the newest commit.

    Args:
        model: the torch ``nn.Module`` (DDP/DataParallel wrappers are unwrapped) or
            MLX module this node trains; its parameters are read and written in
            place. Optional for ``role="closer"``, which never creates the run (it waits up
            to ``join_timeout_s`` for a learner to); given, its schema is checked.
        algorithm: the run's :class:`DiLoCo` settings; must match the run's if it
            exists.
        mailbox: the run's URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
            ``file:///abs/path`` or ``file://rel/path``, ``memory://name``), or an
            open :class:`~gm_shell.mailbox.Mailbox`.
        node: this node's id, unique in the run (``[A-Za-z0-9._-]``, 1-64
            characters); default ``host-pid``. A restarted node may reuse its id.
        role: a :class:`Role` or its name: ``both``, ``learner``, ``closer`` or ``either``
            (which trains a :class:`SharedQueue` through :meth:`run` only).
        options: this node's :class:`SessionOptions` (polling, timeouts).
        mailbox_options: how to reach the bucket
            (:class:`~gm_shell.stores.MailboxOptions`: endpoint, credentials, timeouts).
        callbacks: functions called with every :mod:`gm_shell.events` event, on
            the session's event thread.
        run_id: the id written into a run this node creates (default: random).
        on_diverged: called (on the training thread) after a commit rejected this
            learner's delta as non-finite and the model was reloaded: reset the inner
            optimizer's state there.
        resume: this node's own training state, to resume exactly after a restart with the
            same ``node`` id: a dict of names to values, e.g. ``{"optimizer": opt,
            "scheduler": sched, "data": loader}``. Values with ``state_dict()`` and
            ``load_state_dict()`` are restored in place, others replaced in the dict. It is
            saved to the bucket (``nodes/{node}/resume.bin``) when the node joins, at commit
            boundaries (:attr:`SessionOptions.resume_every_rounds`) and when it closes, and
            restored on entering, before training starts; :attr:`step_count` then goes on
            from the saved step. The model is not in it: its parameters come from the newest
            commit. See the guide "Resuming".
        run_key: the run key that authenticates every object of the run (32 bytes, or 64
            hex characters as ``gm keygen`` prints): every node of the run needs the same
            one, and objects without its tag are refused by name. By default it is read
            from ``GM_RUN_KEY`` or ``GM_RUN_KEY_FILE``; on a shared bucket (``s3://``,
            ``gs://``, ``az://``) one is required unless ``run_key=None`` asks for an open
            run (warned about). ``file://`` and ``memory://`` runs are open by default.
        ranks: split the run's data into this many fixed slices (1 to 1000; every node
            passes the same number): entering the session takes the lowest rank that is
            not done and held by nobody live (waiting while every rank is), and
            :attr:`rank` says which slice to train. A peer that found this node's lease
            dead for the lease timeout may claim the rank over it; then :meth:`step` and
            :meth:`close` raise :class:`~gm_shell.ranks.RankLost`. :meth:`run` marks the
            rank done at the end of its data.
        group: the ``torch.distributed`` process group whose ranks train this one learner
            (every rank constructs the Session and calls the same methods at the same steps;
            group rank 0 is the node in the bucket; see :mod:`gm_shell.group`). By default
            (``"auto"``) the default process group when it is initialized over several ranks
            and ``model`` is a ``DistributedDataParallel`` module or holds DTensor parameters
            (FSDP2's ``fully_shard``); else, and with ``None``, each process is a learner of
            its own, as without torch.distributed. A group of one rank is no group.
        node_key: this node's own Ed25519 private key (32 bytes, or 64 hex characters as
            ``gm keygen --node`` prints), for runs with per-node keys: every object it
            writes is signed with it, and the run's roster must list this node with its
            public key and the roles it acts in. By default from ``GM_NODE_KEY`` or
            ``GM_NODE_KEY_FILE``; None: none (a run with a roster then refuses the node).
        roster: the roster (``gm roster`` writes one) a node that *creates* the run puts
            in its manifest, which turns per-node keys on for the run (a run key is
            needed too): a :class:`~gm_core.records.Roster` or a file's path; by
            default ``GM_ROSTER_FILE``. Ignored when the run exists.
        manifest_digest: join only the run whose manifest has this digest (64 hex
            characters; trust on first use: the node that creates a run logs it in its
            ``run_created`` event, every node in ``run_adopted``, ``gm status`` prints it,
            and :attr:`manifest_digest` holds it). Any other manifest at ``mailbox`` (a
            forged one at a new prefix, a replaced one) is refused by
            :class:`~gm_shell.ManifestPinError` before anything is trained; a pinned node
            never creates a run.

    Raises:
        ValueError: a bad node id, no model for a training role, ``resume`` for a
            closer or holding the model, or a malformed ``manifest_digest``.
        gm_shell.RunKeyError: (at :meth:`start`) no run key for a shared bucket, or a
            malformed one.
        gm_shell.ResumeError: ``resume`` was given and the node's saved state cannot be read
            (the message names the object and how to start afresh).
        gm_shell.RunMismatchError: the run exists with other settings or another model.
        gm_shell.ManifestPinError: (at :meth:`start`) the manifest is not the pinned one.
        gm_shell.NodeKeyError: (at :meth:`start`) per-node keys do not fit: no node key
            for a run with a roster, a key that is not this node's on it, a role the
            roster does not grant, a roster without a run key.
        gm_shell.mailbox.MailboxError: the bucket cannot be used (the message says why
            and what to do).
        gm_shell.ranks.RanksDoneError: (at :meth:`start`) with ``ranks``, every rank is done.
        gm_shell.RunFinishedError: (at :meth:`start`) the run is finished (``finished.json``).
        gm_shell.QueueMismatchError: (at :meth:`start`) the run has another number of ranks.
    """

    def __new__(cls, model: Any = None, *, group: Any = AUTO, **kwargs: Any) -> Session:
        """A :class:`~gm_shell.group_session.GroupSession` where ``group`` names (or the
        default process group is, :func:`gm_shell.group.resolve`) several ranks."""
        if cls is Session and resolve_group(group, model) is not None:
            from gm_shell.group_session import GroupSession

            return super().__new__(GroupSession)
        return super().__new__(cls)

    def __init__(
        self,
        model: Any = None,
        *,
        algorithm: DiLoCo,
        mailbox: str | Mailbox,
        node: str | None = None,
        role: Role | str = Role.BOTH,
        options: SessionOptions | None = None,
        mailbox_options: MailboxOptions | None = None,
        callbacks: Sequence[events.Callback] = (),
        run_id: str | None = None,
        on_diverged: Callable[[], None] | None = None,
        resume: MutableMapping[str, Any] | None = None,
        run_key: RunKey = FROM_ENV,
        ranks: int | None = None,
        group: Any = AUTO,
        manifest_digest: str | None = None,
        node_key: NodeKey = FROM_ENV,
        roster: RosterArg = FROM_ENV,
    ) -> None:
        self.role = Role(role)
        self._node_key_arg = node_key
        self._node_key: bytes | None = None
        self._roster_arg = roster
        self._pinned = pinned_digest(manifest_digest)
        if model is None and self.role is not Role.CLOSER:
            raise ValueError(f"role {self.role} trains a model: pass one")
        if ranks is not None and self.role in (Role.CLOSER, Role.EITHER):
            raise ValueError(f"a {self.role} node trains no fixed slice: it takes no ranks")
        self._ranks = ranks
        self._ranked: RankHolder | None = None
        if resume is not None and (
            self.role is Role.CLOSER or any(v is model for v in resume.values())
        ):
            raise ValueError("resume= holds a learner's own state, not the model (the bucket's)")
        self.node = node or default_node_id()
        if not keys.valid_id(self.node):
            raise ValueError(f"node id {self.node!r}: 1-64 of [A-Za-z0-9._-], no '..'")
        self.algorithm = algorithm
        self.options = options or SessionOptions()
        self._model = model
        self._mailbox_arg = mailbox
        self._mailbox_options = mailbox_options
        self._run_id = run_id or uuid.uuid4().hex[:12]
        self._hub = events.EventHub(callbacks)
        self._on_diverged = on_diverged
        self._divergences = 0
        self._resume = resume
        self._run_key = run_key
        self._run_auth: RunAuth | None = None
        self._members: members.Watch | None = None
        """With per-node keys: what this node has learned of ``members/`` (its runtime
        looks again every ``members_poll_s``)."""
        self._resumer: Resumer | None = None
        self._step_base = 0
        self._pacer: Pacer | None = None
        self._counts_tokens = False
        """The run's ``unit`` is tokens (set from its manifest when the session starts)."""
        self._runtime: Runtime | None = None
        self._loop: LoopThread | None = None
        self._mailbox: Mailbox | None = None
        self._replica: Replica | None = None
        self.manifest: Manifest | None = None
        self.checkpoint: Checkpoint | None = None
        """The commit the model was left at by :meth:`close`."""
        self._closed = False
        self._at_close: Callable[[], None] | None = None
        self.finished = False
        """Whether :meth:`run` found the run finished (it wrote or read ``finished.json``)."""
        self._elected = threading.Event()
        """An ``either`` node's closer was elected (set on the event thread)."""
        self._relieved = threading.Event()
        """An elected ``either`` node's closer no longer leads (set on the event thread)."""
        self.elected = False
        """Whether this ``either`` node was elected closer (and so stopped training), once
        at least."""
        self.relieved = 0
        """How often this elected ``either`` node was relieved (another closer leads) and
        went back to training."""
        self.given_back: list[str] = []
        """Units this ``either`` node had claimed and not started when elected, given back
        (over its elections, in order)."""
        if self.role is Role.EITHER:
            self._hub.subscribe(self._on_event)

    # -- entering ------------------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None:
            self.close()
        else:  # the loop's state is not to be trusted (nor flushed): leave at once
            self._leave()

    def start(self) -> None:
        """Open the mailbox, create or adopt the run, start the runtime, and join."""
        url = self._mailbox_arg.url if isinstance(self._mailbox_arg, Mailbox) else self._mailbox_arg
        if self.options.mmap_threshold is not None:
            fix_mmap_threshold(self.options.mmap_threshold)
        self._run_auth = resolve_run_key(self._run_key, url)
        self._node_key = resolve_node_key(self._node_key_arg)
        warning = open_run_warning(url, self._run_auth)
        if warning is not None:
            warnings.warn(f"{self.node}: {warning}", OpenRunWarning, stacklevel=2)
        self._loop = LoopThread(f"gm-loop-{self.node}")
        try:
            self._mailbox = self._open_mailbox()
            finished = self._loop.begin(fetch_finished(self._mailbox))  # with the manifest's read
            head = self._loop.begin(fetch_head(self._mailbox))  # and so is the walk's start
            adapter = self._adapt()
            self.manifest = self._open_run(adapter)
            self._sign_as_member(self.manifest)
            self._refuse_if_finished(self.manifest, self._loop.result(finished))
            self._counts_tokens = self.manifest.config.unit is Unit.TOKENS
            self._warn_if_wire_is_wide(adapter, self.manifest)
            if self.role is not Role.CLOSER:  # a learner's step() is what would stall
                for advice in advise_node(self.manifest.config, self.options.stall_timeout_s):
                    events.LOG.warning("%s: %s", self.node, advice)
            if adapter is not None and self.role is not Role.CLOSER:
                self._replica = Replica(adapter, self.manifest.plan)
            self._runtime = self._make_runtime(self.manifest)
            self._pacer = self._runtime.pacer
            leaving.opened(self)
            self._runtime.start(self._loop.result(head))
            if self._members is not None:
                self._runtime.watch_members(self._members, self.options.members_poll_s)
            if self._pacer is not None:
                self._pacer.serve(self._pacer.running, self.options.join_timeout_s, self._why)
                self._start_resume(self.manifest)
                if self._ranks is not None:
                    self._ranked = self._hold_rank(self._ranks, self.manifest)
        except BaseException:
            self._leave()  # the runtime may have written the lease already
            raise

    def _sign_as_member(self, manifest: Manifest) -> None:
        """Per-node keys (a run whose manifest has a roster): from now on every object this
        node writes is signed with its key, and every object it reads must be signed by a
        member allowed to write it (gm_core.auth.may_write)."""
        roles = roles_of(self.role is not Role.CLOSER, self.role is not Role.LEARNER)
        reading = reader(self._run_auth, manifest)
        learned = None
        if reading is not None and reading.signing is not None:  # what members/ adds
            assert self._loop is not None
            assert self._mailbox is not None
            watch = members.Watch(of_run(manifest, reading), self.node, now)
            found = self._loop.run(watch.look(self._mailbox))
            for event in found.events:
                self._hub.emit(event)
            learned, self._members = found.signing, watch
        signing = signing_for(manifest, self.node, self._node_key, roles, learned)
        self._run_auth = with_signing(self._run_auth, signing)
        if self._members is not None and signing is not None:
            self._members.judge_by(signing)

    def _start_resume(self, manifest: Manifest) -> None:
        """Restore this node's saved training state, or save its first one (opt-in)."""
        if self._resume is None:
            return
        assert self._mailbox is not None
        assert self._loop is not None
        assert self._replica is not None
        parameters = sum(math.prod(t.shape) for t in manifest.schema)
        opts = self.options
        self._resumer = Resumer(
            self._resume,
            mailbox=self._mailbox,
            loop=self._loop,
            run=manifest.run_id,
            node=self.node,
            every=core_resume.every_rounds(opts.resume_every_rounds, manifest.config.fragments),
            max_bytes=opts.resume_max_bytes or default_max_bytes(parameters),
            sizes=tuple(f.layout.total for f in self._replica.fragments),
            digest_key=resume_digest_key(self._run_auth),
            adopted=self._adopted,
            check=self._check_descent,
            signing=None if self._run_auth is None else self._run_auth.signing,
        )
        saved = self._resumer.restore()
        if saved is None:
            self._resumer.save(self.round, 0)
        else:
            self._step_base = saved.step
            if saved.progress is not None:
                self._lay_back(saved.round, saved.progress)
            self._resumer.saved_round = self.round
            events.LOG.info(
                "%s: resumed at step %d (saved at round %d)", self.node, saved.step, saved.round
            )

    def _adopted(self) -> tuple[int, str] | None:
        """The round and chain digest of the newest record this node's learner adopted
        (saved with its resume state)."""
        runtime = self._runtime
        held = None if runtime is None or runtime.learner is None else runtime.learner.held
        return None if held is None else (held.round, chain_digest(held))

    def _check_descent(self, saved: Saved) -> None:
        """Before restoring a saved state: the tape this node joined must descend from the
        record it had adopted when it saved (spec/protocol.md §16.5.2), checked by reading
        each round back from the joined tip (one GET per round missed, at most
        :data:`MAX_DESCENT_ROUNDS`; beyond, the check is skipped with a warning)."""
        manifest, runtime, mailbox, loop = self.manifest, self._runtime, self._mailbox, self._loop
        if saved.adopted is None or manifest is None or not manifest.chained:
            return
        assert runtime is not None
        assert runtime.learner is not None
        assert mailbox is not None
        assert loop is not None
        since, digest = saved.adopted
        held = runtime.learner.held
        if held is None:
            raise NotDescendedError(
                f"{mailbox.url}: this node adopted round {since} before it stopped, and the "
                "tape now holds no record: it was replaced or removed"
            )
        if held.round - since > MAX_DESCENT_ROUNDS:
            events.LOG.warning(
                "%s: %d rounds since its saved state; not checking that the tape descends "
                "from round %d (over %d)",
                self.node,
                held.round - since,
                since,
                MAX_DESCENT_ROUNDS,
            )
            return
        envelope, config = of_run(manifest, self._run_auth), manifest.config

        async def walk() -> tip.Descent:
            d = tip.descent(held, since, digest)
            while not d.done:
                read = (await read_record(mailbox, envelope, config, d.round)).record
                d = tip.descended(d, read if isinstance(read, RoundRecord) else None)
            return d

        d = loop.run(walk())
        if d.broken is not None:
            raise NotDescendedError(
                f"{mailbox.url}: the tape this node joined (round {held.round}) does not descend "
                f"from the record of round {since} it adopted before it stopped: {d.broken}. "
                "The tape was replaced or forked while it was away, or this is another run; "
                "nothing was trained"
            )

    def _lay_back(self, saved_round: int, progress: Progress) -> None:
        """The parameters' local progress at the save, where the core keeps it (:mod:`drift`)."""
        runtime, pacer, replica = self._runtime, self._pacer, self._replica
        mailbox, loop, manifest = self._mailbox, self._loop, self.manifest
        assert runtime is not None
        assert pacer is not None
        assert replica is not None
        assert mailbox is not None
        assert loop is not None
        assert manifest is not None
        drift.lay_back(
            node=self.node,
            manifest=manifest,
            runtime=runtime,
            pacer=pacer,
            replica=replica,
            mailbox=mailbox,
            loop=loop,
            saved_round=saved_round,
            progress=progress,
            wait_s=self.options.join_timeout_s,
            why=self._why,
        )

    def _refuse_if_finished(self, manifest: Manifest, data: bytes | None) -> None:
        assert self._mailbox is not None
        summary = believed(self._mailbox, of_run(manifest, self._run_auth), data)
        if summary is not None:
            raise RunFinishedError(
                f"{self.url}: the run is {describe(summary)}; start a new run under another prefix"
            )

    def _hold_rank(self, count: int, manifest: Manifest) -> RankHolder:
        """Claim a rank (waiting while every one is held by a live node) and watch it."""
        assert self._mailbox is not None
        assert self._loop is not None
        timeout_s = manifest.config.lease_timeout_s
        holder = RankHolder(
            self._mailbox,
            self._loop,
            node=self.node,
            ranks_count=count,
            lease_timeout_s=timeout_s,
            poll_s=self.options.poll_s,
            watch_s=liveness.renew_interval_s(self.options.renew_s, timeout_s),
            envelope=of_run(manifest, self._run_auth),
        )
        events.LOG.info("%s: holds rank %d (claim %d)", self.node, holder.rank, holder.attempt)
        return holder

    @property
    def rank(self) -> int | None:
        """The rank this node trains (``Session(ranks=N)``, from :meth:`start` on), else None."""
        return None if self._ranked is None else self._ranked.rank

    def _adapt(self) -> ModelAdapter | None:
        if self._model is None:
            return None
        return adapt(self._model, self.algorithm.sync_filter)

    def _warn_if_wire_is_wide(self, adapter: ModelAdapter | None, manifest: Manifest) -> None:
        if adapter is None or self.role is Role.CLOSER:
            return
        problem = wire_wider_than_params(manifest.config, adapter.held())
        if problem is not None:
            warnings.warn(f"{self.node}: {problem}", WireWidthWarning, stacklevel=3)

    def _open_mailbox(self) -> Mailbox:
        if isinstance(self._mailbox_arg, Mailbox):
            return self._mailbox_arg
        return Mailbox.open(self._mailbox_arg, options=self._mailbox_options)

    def _open_run(self, adapter: ModelAdapter | None) -> Manifest:
        assert self._loop is not None
        assert self._mailbox is not None
        mailbox = self._mailbox
        draft = None
        if adapter is not None:
            draft = draft_manifest(
                run_id=self._run_id,
                node=self.node,
                config=self.algorithm.config(adapter.held()),
                schema=adapter.schema(),
                frozen=adapter.frozen(),
                run_auth=self._run_auth,
                roster=self._creation_roster(),
            )
        theirs = self._loop.run(read_manifest(mailbox, self._run_auth, self._pinned))
        waited = self.role is Role.CLOSER or self._pinned is not None
        if theirs is None and waited:
            theirs = self._wait_for_run()
        if theirs is None and draft is not None and adapter is not None and not waited:
            initial = Replica(adapter, draft.plan)
            values = [initial.read(f) for f in range(len(draft.plan.fragments))]
            created = self._loop.run(create(mailbox, draft, values, self._run_auth))
            if created is not None:
                self._emit(
                    events.RunCreated(node=self.node, round=-1, detail=_named(created, mailbox))
                )
                for advice in advise(created.config):  # the node that chose the config hears it
                    events.LOG.warning("%s: this config wastes training: %s", self.node, advice)
                return created
            theirs = self._loop.run(read_manifest(mailbox, self._run_auth))
        if theirs is None and self._pinned is not None:
            raise RunError(
                f"{mailbox.url}: no run here; this node pinned manifest {self._pinned} "
                "(manifest_digest=), so it joins that run and never creates one"
            )
        if theirs is None:
            raise RunError(f"{mailbox.url}: no run here; start a node with a model to create it")
        if draft is not None and adapter is not None:
            draft = attrs.evolve(draft, config=self.algorithm.config(adapter.held(), theirs.config))
        manifest = adopt(draft, theirs, mailbox.url)
        if manifest.created_by != self.node:
            self._emit(
                events.RunAdopted(node=self.node, round=-1, detail=_named(manifest, mailbox))
            )
        return manifest

    @property
    def manifest_digest(self) -> str | None:
        """The digest of the run's manifest (None before :meth:`start`): what other nodes,
        ``align()`` and ``gm status`` pin with ``manifest_digest=``."""
        return None if self.manifest is None else manifest_digest(self.manifest)

    def _creation_roster(self) -> Roster | None:
        """The roster this node writes if it creates the run (it needs a run key)."""
        roster = resolve_roster(self._roster_arg)
        if roster is not None and self._run_auth is None:
            raise NodeKeyError(
                "a roster (per-node keys) needs a run key: set GM_RUN_KEY on every node"
            )
        return roster

    def _wait_for_run(self) -> Manifest | None:
        """A closer (or a node pinned to a manifest) never creates the run: it waits
        (``join_timeout_s``) for a learner to."""
        assert self._loop is not None
        assert self._mailbox is not None
        deadline = time.monotonic() + self.options.join_timeout_s
        while time.monotonic() < deadline:
            time.sleep(min(self.options.poll_s, max(deadline - time.monotonic(), 0.0)))
            theirs = self._loop.run(read_manifest(self._mailbox, self._run_auth, self._pinned))
            if theirs is not None:
                return theirs
        return None

    def _make_runtime(self, manifest: Manifest) -> Runtime:
        assert self._loop is not None
        assert self._mailbox is not None
        opts = self.options
        epoch_us = lease_epoch_us()
        learner_options = core_learner.LearnerOptions(
            poll_s=opts.poll_s,
            renew_s=opts.renew_s,
            close_timeout_s=opts.close_timeout_s,
            flush_on_close=self.algorithm.flush_on_close,
            lease_epoch_us=epoch_us,
        )
        closer_options = core_closer.CloserOptions(
            poll_s=opts.poll_s,
            renew_s=opts.renew_s,
            # A learner of the same node writes the lease and reports the node's requests.
            write_lease=self.role is Role.CLOSER,
            account_own=self.role is Role.CLOSER,
            learns_here=self.role in (Role.BOTH, Role.EITHER),
            either=self.role is Role.EITHER,
            max_sweep_rounds=opts.max_sweep_rounds,
            lease_epoch_us=epoch_us,
            # Secret to this node, so that nobody can pre-occupy where it bids past a flood
            # of invalid claims (spec/protocol.md §16.4.4).
            claim_nonce=os.urandom(16),
        )
        return Runtime(
            node=self.node,
            manifest=manifest,
            mailbox=self._mailbox,
            codec=FragmentCodec(
                manifest,
                compute_backend(
                    opts.compute,
                    torch_model=self._model is None or framework(self._model) == "torch",
                ),
                payload_key(self._run_auth),
            ),
            run_auth=self._run_auth,
            spill=None
            if opts.spill_above is None
            else Spill(directory=opts.spill_dir, above=opts.spill_above),
            hub=self._hub,
            loop=self._loop,
            replica=self._replica,
            learner_options=learner_options if self.role is not Role.CLOSER else None,
            closer_options=closer_options if self.role is not Role.LEARNER else None,
            cache_bytes=opts.cache_bytes,
        )

    # -- training --------------------------------------------------------------------------------

    def step(self, samples: int | None = None, *, tokens: int | None = None) -> None:
        """Count one optimizer step; I/O-free, slow only when work is due.

        Args:
            samples: the examples (sequences, images, rows) this step trained on;
                counted by a run of ``DiLoCo(unit="samples")``, the default (1 if omitted).
            tokens: the tokens this step trained on; counted by a run of
                ``DiLoCo(unit="tokens")``, where it is required.

        The run's unit weighs this learner's deltas (tokens²/steps, whichever unit) and is
        what ``gm status`` reports as committed; the other count, when given too, is ignored.

        Raises:
            ValueError: only the count the run does not use was given.
            StalledError: no progress for ``stall_timeout_s`` (the message says where
                the learner waits and what to check).
        """
        pacer = self._pacer
        if pacer is None:
            raise RuntimeError("step() needs a started session with a learner role")
        ranked = self._ranked
        if ranked is not None and ranked.lost is not None:
            raise ranked.lost
        count = tokens if self._counts_tokens else samples
        if count is None:
            count = self._missing_count(samples, tokens)
        pacer.step += 1
        pacer.tokens += count
        if pacer.step >= pacer.barrier:
            pacer.stepped(self.options.stall_timeout_s, self._why)
            runtime = self._runtime
            if runtime is not None and runtime.divergences != self._divergences:
                self._diverged(runtime.divergences)
            if self._resumer is not None and self._resumer.due(self.round):
                self._save_at_boundary()

    def _save_at_boundary(self) -> None:
        """A resume save with the parameters' local progress, taken at this step."""
        resumer, runtime, pacer, replica = self._resumer, self._runtime, self._pacer, self._replica
        assert resumer is not None
        assert runtime is not None
        assert pacer is not None
        assert replica is not None
        aligned, progress = drift.take(runtime, pacer, replica)
        resumer.at_boundary(aligned, self.step_count, progress)

    def _missing_count(self, samples: int | None, tokens: int | None) -> int:
        """``step()`` without the run's count: one sample, or a mistake worth naming."""
        if self._counts_tokens:
            raise ValueError(
                "this run counts tokens (DiLoCo(unit='tokens')): pass step(tokens=...)"
            )
        if tokens is not None:
            raise ValueError(
                "this run counts samples: pass step(samples=...), or create the run with "
                "DiLoCo(unit='tokens') to count tokens"
            )
        return 1

    def _diverged(self, times: int) -> None:
        """The learner reloaded its model after a non-finite delta (on this thread, between
        steps): reset what the user registered, or stop once it keeps happening."""
        self._divergences = times
        if times == 0:
            return
        if times >= self.options.max_divergences:
            raise DivergedError(
                f"{self.node}: {times} commits in a row rejected this learner's delta as "
                "non-finite although its model was reloaded each time; lower the learning "
                "rate or check the data"
            )
        if self._on_diverged is not None:
            self._on_diverged()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Non-training work (an eval pass, a checkpoint, a warm-up) whose time is not step time.

        The step is reported on entry and again on exit, so the step-time sample before
        the pause ends where it starts and the next one starts where it ends: the run's
        estimates, grace windows and timeouts never see the pause. The node stays live
        meanwhile (its lease is renewed), and peers wait for its due snapshots as usual.
        """
        pacer, runtime = self._pacer, self._runtime
        if pacer is None or runtime is None:
            raise RuntimeError("pause() needs a started session with a learner role")
        runtime.report(pacer.step, pacer.tokens)
        try:
            yield
        finally:
            if self._pacer is pacer and runtime.failure is None:
                runtime.report(pacer.step, pacer.tokens)

    def _why(self) -> str:
        runtime = self._runtime
        state = runtime.learner if runtime is not None else None
        if state is None:
            return f"{self.node}: the session never started its learner"
        cfg = state.manifest.config
        return (
            f"{self.node}: training made no progress for its timeout at step {state.step} "
            f"(phase {state.phase}, waiting for round {state.next_round}, newest aligned round "
            f"{state.aligned_round}, in_flight={cfg.in_flight}, "
            f"overlap_steps={cfg.overlap_steps}); is a closer running and is {self.url} reachable?"
        )

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, wait for this node's rounds (bounded), release, and leave the newest commit."""
        if self._closed:
            return  # :meth:`run` closed it already
        runtime, pacer = self._runtime, self._pacer
        ranked = self._ranked
        if ranked is not None:
            ranked.stop()
            if ranked.lost is not None:
                self._leave()
                raise ranked.lost
        try:
            if runtime is not None and runtime.failure is None:
                if pacer is not None:
                    pacer.serve(lambda: True, self.options.stall_timeout_s, self._why, report=True)
                    pacer.closing()
                    runtime.request_close(Machine.LEARNER)
                    timeout_s = self.options.close_timeout_s + 30.0
                    pacer.serve(runtime.learner_closed.is_set, timeout_s, self._why)
                    self.checkpoint = self._leave_at_newest(runtime)
                    if self._resumer is not None:
                        self._resumer.save(self.checkpoint.round, self.step_count, raising=False)
                if self._at_close is not None:
                    self._at_close()  # run(): the learner is closed, the closer still serves
                if runtime.closer is not None:
                    runtime.request_close(Machine.CLOSER)
        except BaseException:
            self._leave()
            raise
        if runtime is not None and runtime.failure is not None:
            self._leave()  # the runtime died: nothing released its lease
        else:
            self._teardown()

    def _leave(self) -> None:
        """Stop at once and delete this node's lease: no flush, no waiting for commits."""
        runtime, loop = self._runtime, self._loop
        try:
            if self._ranked is not None:
                with contextlib.suppress(Exception):
                    self._ranked.stop()
            if runtime is not None and loop is not None and loop.alive:
                # Nothing is fed to the machines any more, so they issue no new renewal.
                loop.call(lambda: setattr(runtime, "failure", runtime.failure or LeftError()))
                runtime.shutdown()  # requests in flight (a renewal) land before the delete
                if self._mailbox is not None:
                    helper = LoopThread(f"gm-leave-{self.node}")
                    try:
                        helper.run(self._mailbox.delete([keys.lease(self.node)]), timeout_s=30.0)
                    finally:
                        helper.stop()
        finally:
            self._teardown()

    def _leave_at_newest(self, runtime: Runtime) -> Checkpoint:
        assert self._loop is not None
        assert self._mailbox is not None
        assert self.manifest is not None
        assert runtime.learner is not None
        assert self._replica is not None
        mailbox, manifest = self._mailbox, self.manifest
        held, envelope = runtime.learner.held, runtime.learner.envelope

        async def read() -> tuple[Any, str, list[Any]]:
            record, stopped = await newest_record(mailbox, envelope, manifest, held)
            return record, stopped, await load_frontier(manifest, record, runtime.commit)

        record, stopped, values = self._loop.run(read())
        self._replica.overwrite_all(values)
        frontier = record.frontier if record is not None else manifest.init
        return Checkpoint(
            round=-1 if record is None else record.round,
            versions=tuple(fs.version for fs in frontier),
            stopped_at=stopped,
        )

    def _teardown(self) -> None:
        self._closed = True
        leaving.closed(self)
        if self._runtime is not None:
            self._runtime.shutdown()
        elif self._loop is not None:
            self._loop.stop()
        if self._mailbox is not None and not isinstance(self._mailbox_arg, Mailbox):
            self._mailbox.close()
        self._hub.close()
        self._pacer = None

    def run(
        self, step: Callable[[Any], int | None], data: Iterable[Any] | SharedQueue[Any]
    ) -> None:
        """Train to the end of ``data``, say so in the bucket, and close the session.

        Args:
            step: trains one optimizer step on one batch and returns what it counted in the
                run's unit (samples, or tokens with ``DiLoCo(unit="tokens")``; None: one
                sample); :meth:`run` passes it to :meth:`step`.
            data: this node's own iterable of batches, or a :class:`SharedQueue` whose units
                the nodes share: each unit is trained to its end by one node (again by
                another only if its holder dies), and this node returns once every unit is
                done.

        An ``either`` node (``data`` must be a queue) trains until the run elects it its
        closer; then it gives back its unstarted units, closes its learner without a done
        marker (its lease goes on as the closer's), closes rounds until the run is finished
        (:meth:`serve`; :attr:`elected` and :attr:`finished` say so) and closes the session.
        Should another closer lead instead (it took a round over, or a dedicated closer came
        and was named), the node trains again (:attr:`relieved`): only the leader serves.

        At the end of a plain iterable the node writes ``done/{node}.json`` (with ``ranks``,
        its rank's done marker, or raises :class:`~gm_shell.ranks.RankLost` if a peer holds
        the rank now); with a queue, each unit's done marker is written in the background
        while the next unit trains (the next was claimed and checked while this one trained,
        so no store request sits between two units; :mod:`gm_shell.queue`), or before this
        node waits for a unit, gives its units back, or closes.
        Then the session closes: the last deltas are flushed and committed, and, before
        this node's closer stops, it looks whether the whole run is finished (every unit or
        rank done, or with plain data some node done, and no learner live on this node's
        clock, waiting at most ``close_timeout_s`` plus two lease timeouts for peers to
        leave); if so it writes ``finished.json`` (``gm status`` shows it) and sets
        :attr:`finished`. An exception, from ``step`` or the bucket, leaves the run at once
        with no done marker, and is raised.
        """
        if self._pacer is None or self.manifest is None:
            raise RuntimeError("run() needs a started session with a learner role")
        try:
            if self.role is Role.EITHER and not isinstance(data, SharedQueue):
                raise ValueError("an 'either' node trains a SharedQueue, whose units it gives back")
            if isinstance(data, SharedQueue):
                if self._ranked is not None:
                    raise ValueError("ranks are fixed slices: train the rank's data, not a queue")
                while self._run_queue(step, data):
                    if self._serve_elected():
                        return
                shape: Shape = Queued(frozenset(data.units))
            elif self._ranked is not None and self._ranks is not None:
                steps, tokens = self._train(step, data)
                self._ranked.finish(steps, tokens)
                shape = Ranked(self._ranks)
            else:
                steps, tokens = self._train(step, data)
                self._mark_done(steps, tokens)
                shape = Plain()
        except BaseException:
            self._leave()
            raise
        queue = data.name if isinstance(data, SharedQueue) else ""
        self._at_close = lambda: self._look_finished(shape, queue)
        self.close()

    def _train(self, step: Callable[[Any], int | None], batches: Iterable[Any]) -> tuple[int, int]:
        """Step through ``batches``; the steps taken and what they counted."""
        steps = counted = 0
        for batch in batches:
            got = step(batch)
            count = 1 if got is None else int(got)
            if self._counts_tokens:
                self.step(tokens=count)
            else:
                self.step(samples=count)
            steps += 1
            counted += count
        return steps, counted

    def _run_queue(self, step: Callable[[Any], int | None], data: SharedQueue[Any]) -> bool:
        """Train the queue's units to the end (False), or until this ``either`` node is
        elected closer (True: its unit in progress trained, its unstarted units given back)."""
        assert self._mailbox is not None
        assert self._loop is not None
        assert self.manifest is not None
        spec = data.spec(
            node=self.node,
            lease_timeout_s=self.manifest.config.lease_timeout_s,
            poll_s=self.options.poll_s,
            envelope=of_run(self.manifest, self._run_auth),
        )
        consumer = Consumer(self._mailbox, self._loop, spec)
        try:
            while not self._elected.is_set():
                unit = self._want(consumer, data)
                if unit is None:
                    return False
                steps, counted = self._train(step, data.load(data.values[unit.unit]))
                consumer.end(unit.unit, steps, counted)  # its marker: written behind the next
            given = consumer.give_back()
            self.given_back += given
            events.LOG.info(
                "%s: elected closer: gave back %d unstarted units %s", self.node, len(given), given
            )
            return True
        except BaseException:
            # Leaving with an error (from ``step``, the bucket, an interrupt): the unit cut
            # short and those claimed ahead go back now (gm_core.queue.GiveBack.leaving),
            # not after this node's lease has aged out on a peer's clock.
            consumer.give_back_leaving(timeout_s=LEAVING_GIVE_BACK_S)
            raise
        finally:
            consumer.close()

    def _want(self, consumer: Consumer, data: SharedQueue[Any]) -> Any:
        """The next unit of ``data`` this node trains (an ``Assignment``), None once every
        unit is done (a group's leader also tells its ranks)."""
        return consumer.want()

    def _on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Elected):
            self._relieved.clear()
            self._elected.set()
        elif isinstance(event, events.Relieved):
            self._relieved.set()

    def _serve_elected(self) -> bool:
        """This ``either`` node serves as closer: its learner closes, handing the lease to
        the closer (no gap its followers could take for a death), then it closes rounds until
        the run is finished (True: the session is closed), or until it no longer leads
        (False: a fresh learner joins from the newest commit, and it trains again).

        Why train again: a node that does not lead closes nothing, so serving on would only
        take a learner out of the run; and when a takeover from a stalled elected node elects
        its taker too (the double election), the one relieved going back is what leaves a
        single node serving.
        """
        runtime, pacer = self._runtime, self._pacer
        assert runtime is not None
        assert pacer is not None
        self.elected = True
        pacer.serve(lambda: True, self.options.stall_timeout_s, self._why, report=True)
        runtime.request_close(Machine.LEARNER, keep_lease=True)
        timeout_s = self.options.close_timeout_s + 30.0
        pacer.serve(runtime.learner_closed.is_set, timeout_s, self._why)
        self.checkpoint = self._leave_at_newest(runtime)
        self._pacer = None  # no training while serving: close() only stops the closer
        events.LOG.info("%s: trains no more; closes rounds until the run is finished", self.node)
        self._serve(stop=self._relieved.is_set)
        if self.finished:
            self.close()
            return True
        self._elected.clear()
        self._relieved.clear()
        self.relieved += 1
        runtime.rejoin_learner()
        self._pacer = pacer
        events.LOG.info("%s: another closer leads: trains again", self.node)
        return False

    def _look_finished(self, shape: Shape, queue: str) -> None:
        """Decide whether the run is finished, and say so in the bucket (:mod:`gm_core.finish`)."""
        assert self._mailbox is not None
        assert self._loop is not None
        assert self.manifest is not None
        config = self.manifest.config
        spec = finish.FinishSpec(
            node=self.node,
            shape=shape,
            queue=queue,
            round=-1 if self.checkpoint is None else self.checkpoint.round,
            lease_timeout_s=config.lease_timeout_s,
            poll_s=self.options.poll_s,
            wait_s=self.options.close_timeout_s + 2 * config.lease_timeout_s,
            envelope=of_run(self.manifest, self._run_auth),
        )
        logged = [0]

        def seen(state: finish.FinishState) -> None:
            logged[0] = log_rejections("finish", state.rejections, state.rejected, logged[0])

        state = self._loop.run(
            drive(
                self._mailbox,
                finish.advance,
                finish.initial(spec),
                Started(now_s=now()),
                settled=lambda s: s.phase is finish.Phase.DONE,
                seen=seen,
            )
        )
        self.finished = state.outcome is finish.Outcome.FINISHED
        events.LOG.info("%s: %s", self.node, finish.describe(state))

    def _mark_done(self, steps: int, tokens: int) -> None:
        """Write ``done/{node}.json``: this node's own data ran out (create-once: a restart
        that runs out again leaves the first marker)."""
        assert self._mailbox is not None
        assert self._loop is not None
        assert self.manifest is not None
        key = keys.done(self.node)
        marker = DoneMarker(node=self.node, attempt=0, steps=steps, tokens=tokens)
        body = of_run(self.manifest, self._run_auth).seal(key, encode_done(marker))
        self._loop.run(self._mailbox.put_once(key, body))

    def barrier(self, name: str, parties: int, *, timeout_s: float = 600.0) -> Barrier:
        """A :class:`~gm_shell.barrier.Barrier` in this run's bucket with this node as a party.

        It runs on the session's own loop and mailbox (the lease stays renewed while it
        waits) and polls every :attr:`SessionOptions.poll_s`; close it, or the session, when
        done. Every party passes the same ``name`` and ``parties``. In an authenticated run
        its objects are named with the run key: only the run's nodes can arrive or release.
        """
        if self._loop is None or self._mailbox is None or self.manifest is None:
            raise RuntimeError("barrier() needs a started session")
        return Barrier(
            name,
            parties=parties,
            mailbox=self._mailbox,
            party=self.node,
            timeout_s=timeout_s,
            poll_s=self.options.poll_s,
            loop=self._loop,
            envelope=of_run(self.manifest, self._run_auth),
        )

    def serve(self, duration_s: float | None = None) -> None:
        """Block while the node works (a closer-only node's main loop): until the run is
        finished (``finished.json``; :attr:`finished` is then True), or for ``duration_s``.

        It looks for ``finished.json`` once per renewal interval (one GET); the node that
        finds the run finished writes it after its own final rounds are committed, so a
        closer returning here has nothing left to commit. Close the session after it.
        """
        self._serve(duration_s)

    def _serve(
        self, duration_s: float | None = None, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """:meth:`serve`, returning early too once ``stop()`` is true."""
        deadline = math.inf if duration_s is None else time.monotonic() + duration_s
        runtime, manifest = self._runtime, self.manifest
        if runtime is None or manifest is None or self._loop is None or self._mailbox is None:
            raise RuntimeError("serve() needs a started session")
        envelope = of_run(manifest, self._run_auth)
        every_s = liveness.renew_interval_s(self.options.renew_s, manifest.config.lease_timeout_s)
        look_at = time.monotonic()
        while time.monotonic() < deadline and not stop():
            if runtime.failure is not None:
                raise RuntimeError("the gm session failed") from runtime.failure
            if time.monotonic() >= look_at:
                look_at = time.monotonic() + every_s
                try:
                    summary = self._loop.run(read_finished(self._mailbox, envelope))
                except Exception as error:  # the store is down: look again later
                    events.LOG.info("%s: could not look for finished.json: %s", self.node, error)
                    summary = None
                if summary is not None:
                    self.finished = True
                    events.LOG.info("%s: the run is %s", self.node, describe(summary))
                    return
            time.sleep(min(0.5, every_s, max(deadline - time.monotonic(), 0.0)))

    # -- what a user may look at -----------------------------------------------------------------

    def _emit(self, event: events.Event) -> None:
        self._hub.emit(attrs.evolve(event, at_s=now()))

    def on_event(self, callback: events.Callback) -> None:
        """Call ``callback`` with every later event (on the session's event thread)."""
        self._hub.subscribe(callback)

    @property
    def events(self) -> list[events.Event]:
        """The most recent events, oldest first."""
        return list(self._hub.recent)

    @property
    def url(self) -> str:
        return self._mailbox.url if self._mailbox is not None else str(self._mailbox_arg)

    @property
    def step_count(self) -> int:
        """Optimizer steps this node has counted, from the saved step when it resumed."""
        return self._step_base + (self._pacer.step if self._pacer is not None else 0)

    @property
    def round(self) -> int:
        """The newest round whose commit this learner has folded into its model."""
        runtime = self._runtime
        state = runtime.learner if runtime is not None else None
        return state.aligned_round if state is not None else -1

    @property
    def batch_size(self) -> int | None:
        """This node's share of ``global_batch_size`` among the learners the newest commit's
        closer saw live (:func:`gm_core.batch.share`: ``global // n``, one more for the first
        ``global mod n`` ids in byte order, so the shares sum to exactly ``global``; at least
        1). It changes only when membership does."""
        total = self.algorithm.global_batch_size
        if total is None:
            return None
        runtime = self._runtime
        members = runtime.members if runtime is not None else ()
        return core_batch.share(total, members, self.node)

    @property
    def stats(self) -> Stats:
        """Requests and bytes this node has sent to the bucket."""
        return self._mailbox.stats if self._mailbox is not None else Stats()

    def cost_usd(self, prices: PriceTable = PRICES_S3) -> float:
        return cost_usd(self.stats, prices)
