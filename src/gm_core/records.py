"""Wire records: every object gm writes into the bucket, as frozen values.

Theory of operation
-------------------
The bucket is the only channel between nodes, so its objects are the protocol's
messages. Each one is a frozen, slotted attrs value with a ``format`` field naming
the wire version it was written with; :mod:`gm_core.codec` turns them into strict
JSON and back. Records point at tensor payloads through :class:`PayloadRef`
(key, size and content digest), never embed them: the payload is written first,
so a record can only name bytes that already exist ("payload before pointer").

The round record is the commit point of the whole protocol. It carries the
*frontier* — the version and payload references of every fragment — so that a
joining learner or a new closer reads one record, not the tape.
"""

from __future__ import annotations

import enum

import attrs

FORMAT_VERSION = 1
"""The field set of every record: what a value's ``format`` holds in memory, and the wire
format of runs created before format 2 (open ones: bodies written bare, ``format: 1``)."""
FORMAT_2 = 2
"""The wire format of runs created by this code (spec/protocol.md §16.7): in an
authenticated run every object in the ``gm/2`` envelope, in an open one bare, each body
declaring ``format: 2`` (the manifest's ``format`` is the run's). Same fields as format 1;
what differs besides the envelope is the claims (§16.4.4): named, attempts below
:data:`CLAIM_LIMIT_2`. A body of the other number at a run's key is refused by name
(``wrong_format``) in an authenticated run."""
CLAIM_LIMIT_2 = 2**32
"""Claim attempts (and a record's ``claim``) of a format-2 body are below this; a format-1
body's below :data:`gm_core.keys.ATTEMPT_LIMIT` (``10^4``, the numbered keys' four digits)."""
FORMATS = (FORMAT_VERSION, FORMAT_2)
"""The wire formats this code reads; a higher number is a newer writer's."""


class Reason(enum.StrEnum):
    """Why a closer did not accept a snapshot (recorded in the round record)."""

    ZERO_STEPS = "zero_steps"
    SCHEMA = "schema"
    STALE = "stale"
    MISSING = "missing"
    CORRUPT = "corrupt"
    NONFINITE = "nonfinite"
    UNSIGNED = "unsigned"
    OUTLIER = "outlier"
    """Its delta's norm or its cosine to the robust centre of the round was an outlier
    (:func:`gm_core.robust.outliers`); only with ``outlier_norm_factor``/``outlier_cosine``."""
    UNAUTHENTICATED = "unauthenticated"
    """The snapshot object does not carry the run key's tag (gm_core.auth)."""


class Alignment(enum.StrEnum):
    """How a learner folds a commit into its own parameters."""

    OVERWRITE = "overwrite"
    BLEND = "blend"
    CARRY = "carry"
    ADAPTIVE = "adaptive"
    """A run's rule only, never a fold: per fragment, carry or overwrite by the mean pairwise
    cosine the commits record (:mod:`gm_core.adaptive`); a learner's ``Align`` says which."""


FOLDS = (Alignment.OVERWRITE, Alignment.BLEND, Alignment.CARRY)
"""The alignments a commit is folded in by (``Align.mode``); ``adaptive`` picks one of them."""


class MergeRule(enum.StrEnum):
    """How a closer combines the accepted deltas of a round."""

    MEAN = "mean"
    RDA = "rda"
    TRIMMED_MEAN = "trimmed_mean"
    """Coordinate-wise: drop the ``trim`` lowest and highest values, weighted mean of the rest."""
    MEDIAN = "median"
    """Coordinate-wise: the trimmed mean that keeps the middle one (odd) or two (even) values."""


class Partition(enum.StrEnum):
    """How tensors are dealt into fragments."""

    BYTES = "bytes"
    STRIDED = "strided"


class WireFormat(enum.StrEnum):
    """Element encodings a payload may use on the wire."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    F8_E4M3 = "F8_E4M3"
    F4_E2M1 = "F4_E2M1"


class Compression(enum.StrEnum):
    NONE = "none"
    ZSTD = "zstd"


class Unit(enum.StrEnum):
    """What a run's learners count per step, carried as snapshots' ``tokens`` (merge weight)."""

    SAMPLES = "samples"
    TOKENS = "tokens"


@attrs.frozen(kw_only=True)
class PayloadRef:
    """A tensor payload in the bucket; ``digest`` is the hex content hash of its bytes."""

    key: str
    size: int
    digest: str


@attrs.frozen(kw_only=True)
class TensorSpec:
    """One model tensor: name, shape and the dtype the model holds it in."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@attrs.frozen(kw_only=True)
class FrozenTensor:
    """A parameter the run does not synchronize, pinned by the digest of its values.

    ``digest`` is the hex blake3 of the values as little-endian fp32 (whatever dtype
    the model holds them in), so a node whose frozen base differs is refused by name.
    """

    name: str
    shape: tuple[int, ...]
    digest: str


AUTH_ALG = "hmac-sha256"
"""The algorithm authenticated runs tag their objects with (gm_core.auth)."""


@attrs.frozen(kw_only=True)
class AuthInfo:
    """How an authenticated run's objects are tagged: the algorithm and the run key's id.

    The key itself never enters the bucket; the id lets a node with the wrong key say
    so by name instead of waiting for a manifest it cannot verify (gm_core.auth).
    """

    alg: str
    key_id: str


ROLE_LEARNER = "learner"
ROLE_CLOSER = "closer"
ROSTER_ROLES = (ROLE_LEARNER, ROLE_CLOSER)
"""The roles a roster can grant (spec/protocol.md §16.3.2)."""


@attrs.frozen(kw_only=True)
class Member:
    """One node a run with per-node keys admits: its id, what it may write, its key.

    ``public_key`` is the node's Ed25519 public key (64 lowercase hex characters); an
    object signed by ``node`` is believed only under this key, and only at keys its
    ``roles`` allow (``learner``: its own snapshots; ``closer``: records, claims, the
    head and follow markers; every member: its own lease and done marker).
    """

    node: str
    roles: tuple[str, ...]
    public_key: str


@attrs.frozen(kw_only=True)
class Roster:
    """Who may write a run with per-node keys: inline in its manifest (protocol §16.3.3).

    ``authority`` is the Ed25519 public key that issued the roster and ``signature`` its
    signature over the members (:func:`gm_core.auth.roster_message`): a node told the
    authority's key (``GM_RUN_AUTHORITY``) joins only a run whose roster it signed.
    """

    authority: str
    members: tuple[Member, ...]
    signature: str


EMBEDDING_PATTERN = r"embed|(?:^|\.)(?:wte|wpe|lm_head)(?:\.|$)"
"""Tensors merged by plain weighted mean under RDA (``re.search`` on the name): anything
named ``embed`` (Llama ``embed_tokens``, BERT ``embeddings``), GPT-2's ``wte``/``wpe``,
and output heads named ``lm_head`` (tied to the input embedding in many families)."""


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """Everything every node must agree on for the run to be one run."""

    sync_every: int
    fragments: int
    quorum: int = 1
    in_flight: int = 2
    overlap_steps: int | None = None
    alignment: Alignment = Alignment.OVERWRITE
    mixing: float = 1.0
    merge: MergeRule = MergeRule.MEAN
    embedding_pattern: str = EMBEDDING_PATTERN
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    partition: Partition = Partition.BYTES
    delta_format: WireFormat = WireFormat.F32
    commit_format: WireFormat = WireFormat.F32
    compression: Compression = Compression.NONE
    grace_gamma: float = 0.5
    lease_timeout_s: float = 30.0
    takeover_floor_s: float = 10.0
    global_batch_size: int | None = None
    require_signatures: bool = False
    unit: Unit = Unit.SAMPLES
    """What ``tokens`` counts in this run's snapshots and records (the field keeps its name);
    added after format 1: a manifest without it is a samples run (``Session.step(samples=)``)."""
    max_share: float | None = None
    """No learner's share of a merge exceeds this many times an equal share (``1/n``);
    None caps nothing. Added after format 1: a manifest without it caps nothing."""
    trim_fraction: float = 0.25
    """Under ``trimmed_mean``, the share of a round's deltas dropped at each end of every
    coordinate (at least one, at most ``(k-1)//2``; see :func:`gm_core.robust.trim_count`)."""
    clip_norm_factor: float | None = None
    """Deltas whose norm exceeds this many times the round's median delta norm are scaled
    down to it before merging; None clips nothing."""
    outlier_norm_factor: float | None = None
    """A delta whose norm exceeds this many times the round's median norm is rejected as
    ``outlier`` (rounds of 3 or more deltas; never a majority); None rejects none by norm."""
    outlier_cosine: float | None = None
    """A delta whose cosine to the round's coordinate-wise median is below this is rejected
    as ``outlier`` (as above); None rejects none by direction. The robust-merge fields
    (these four) were added after format 1: a manifest without them is a plain merge."""
    grace_seconds: float | None = None
    """A fixed grace window: once quorum is in, the closer waits this many seconds for the
    other live learners' snapshots, whatever the timing estimates say (the reference
    package's ``grace_seconds``); None: the adaptive window of ``grace_gamma``. Added
    after format 1: a manifest without it is adaptive."""
    carry_above: float = 0.6
    """Under ``adaptive`` alignment, a fragment carries from a commit whose round's deltas had
    a mean pairwise cosine of at least this on (:func:`gm_core.adaptive.next_mode`)."""
    overwrite_below: float = 0.4
    """Under ``adaptive`` alignment, a fragment overwrites from a commit whose cosine is below
    this on; in between it keeps its mode. ``-1 <= overwrite_below <= carry_above <= 1``.
    Both added after format 1, with these defaults as their absent values."""
    follow: int = 0
    """A learner heading for a round that is not yet due publishes it at once, with the steps
    it has, once the round's leader has accepted this many other learners' snapshots in it
    (capped by the other live learners; :mod:`gm_core.follow`); 0 never. Added after format
    1: a manifest without it never publishes early."""


@attrs.frozen(kw_only=True)
class FragmentPlan:
    """Tensor names of each fragment, in fragment order; every tensor in exactly one."""

    fragments: tuple[tuple[str, ...], ...]


@attrs.frozen(kw_only=True)
class FragmentState:
    """Committed state of one fragment: its version and where its tensors live."""

    version: int
    theta: PayloadRef
    momentum: PayloadRef | None


@attrs.frozen(kw_only=True)
class Manifest:
    """The run's create-once birth certificate: config, schema, plan, initial frontier.

    ``schema`` is the *wire* schema: the synchronized (trainable) parameters as every
    payload carries them, dtype ``F32`` (a learner's own parameter dtypes are its
    business). ``frozen`` pins the parameters that are not synchronized (a LoRA run's
    base model): checked once at join, never shipped.
    """

    format: int = FORMAT_VERSION
    run_id: str
    created_by: str
    config: AlgorithmConfig
    schema: tuple[TensorSpec, ...]
    plan: FragmentPlan
    init: tuple[FragmentState, ...]
    frozen: tuple[FrozenTensor, ...] = ()
    auth: AuthInfo | None = None
    """None: an open run (bare objects); else every object is tagged under this key.
    Added after format 1: a manifest without it is an open run."""
    chained: bool = False
    """Every record names its predecessor's digest (``RoundRecord.prev``) and a node adopts a
    record only when it chains to the one it holds (spec/protocol.md §16.5). Runs created
    by gm since session 9 are chained; added after format 1: a manifest without it is not,
    and its records are written as format 1 writes them."""
    roster: Roster | None = None
    """Per-node keys (spec/protocol.md §16.3): every object is also signed by its writer,
    who must be a member allowed to write its key. None: the run key alone (or an open
    run). Added after format 1; only authenticated runs may have one."""


_COUNT_MAX = 2**63 - 1


@attrs.frozen(kw_only=True)
class Requests:
    """Store requests by billing class (HEAD counts as GET), as the nodes' mailboxes metered them.

    Snapshots carry the requests their learner's node made since its last
    accepted snapshot, and every round record the run's total through that
    round, so ``gm status`` can price a run from its newest record alone.
    """

    lists: int = 0
    gets: int = 0
    puts: int = 0
    deletes: int = 0

    def __add__(self, other: Requests) -> Requests:
        """The sum, saturating at the largest count a record can carry (peers' counts are input)."""
        return Requests(
            lists=min(self.lists + other.lists, _COUNT_MAX),
            gets=min(self.gets + other.gets, _COUNT_MAX),
            puts=min(self.puts + other.puts, _COUNT_MAX),
            deletes=min(self.deletes + other.deletes, _COUNT_MAX),
        )

    def __sub__(self, other: Requests) -> Requests:
        """What was made since ``other``, an earlier reading of the same counters (never < 0)."""
        return Requests(
            lists=max(self.lists - other.lists, 0),
            gets=max(self.gets - other.gets, 0),
            puts=max(self.puts - other.puts, 0),
            deletes=max(self.deletes - other.deletes, 0),
        )


@attrs.frozen(kw_only=True)
class Snapshot:
    """A learner's contribution to one round: the delta of one fragment and its weight."""

    format: int = FORMAT_VERSION
    learner: str
    round: int
    fragment: int
    base_version: int
    steps: int
    tokens: int
    step_s: float
    schema_digest: str
    payload: PayloadRef
    final: bool = False
    signature: str = ""
    requests: Requests = Requests()


@attrs.frozen(kw_only=True)
class Participant:
    """An accepted snapshot as the closer weighed it."""

    learner: str
    steps: int
    tokens: int
    weight: float
    base_version: int
    final: bool


@attrs.frozen(kw_only=True)
class Rejection:
    learner: str
    reason: Reason


@attrs.frozen(kw_only=True)
class Timing:
    """EMAs carried from record to record; ``None`` until first measured."""

    step_s: float | None = None
    quorum_s: float | None = None
    sync_s: float | None = None


@attrs.frozen(kw_only=True)
class RoundRecord:
    """The commit point of round ``round``: written create-once after its payloads.

    ``version`` is the fragment's version after this round; a round with no
    participants commits nothing new and keeps the previous version and payloads.
    ``claim`` is 0 when ``closer`` was named by the previous record, otherwise the
    number of the create-once claim through which ``closer`` took the round over.
    ``swept_below`` is the closer's garbage-collection low-water mark (every round
    below it has been swept), so a successor does not sweep the tape again.
    ``requests`` is the run's store requests accounted through this round: the
    previous record's total, its participants' and its closer's node's own.
    """

    format: int = FORMAT_VERSION
    round: int
    step: int
    fragment: int
    version: int
    participants: tuple[Participant, ...]
    rejections: tuple[Rejection, ...]
    cosine: float | None
    timing: Timing
    quorum_s: float
    grace_s: float
    theta: PayloadRef
    outer: PayloadRef | None
    update: PayloadRef | None
    closer: str
    claim: int
    next_closer: str
    frontier: tuple[FragmentState, ...]
    swept_below: int = 0
    requests: Requests = Requests()
    prev: str | None = None
    """In a chained run (``Manifest.chained``): the chain digest of the record of the round
    before (of the manifest for round 0), :func:`gm_core.tape.chain_digest`. Added after
    format 1: absent in records of runs that are not chained."""
    live: tuple[str, ...] = ()
    """The learners the closer saw live when it committed (leases renewing, snapshots judged),
    in byte order: what :mod:`gm_core.batch` splits ``global_batch_size`` among. Added after
    format 1: a record without it names none (its participants stand in)."""


@attrs.frozen(kw_only=True)
class Lease:
    """A node's liveness token, overwritten every renewal; observers watch it change."""

    format: int = FORMAT_VERSION
    node: str
    roles: tuple[str, ...]
    seq: int
    renew_s: float


@attrs.frozen(kw_only=True)
class Claim:
    """Create-once bid ``attempt`` by ``node`` to close ``round`` in place of its closer."""

    format: int = FORMAT_VERSION
    round: int
    attempt: int
    node: str


@attrs.frozen(kw_only=True)
class Head:
    """A hint of the newest committed round; readers probe forward from it."""

    format: int = FORMAT_VERSION
    round: int


@attrs.frozen(kw_only=True)
class Certificate:
    """The run authority admits ``member`` to the run (protocol §16.3.3), without a new
    manifest: stored create-once under ``members/{node}/``, tagged with the run key, and
    ``signature`` is the authority's over the run id and the member
    (:func:`gm_core.members.certificate_message`)."""

    format: int = FORMAT_VERSION
    member: Member
    signature: str


@attrs.frozen(kw_only=True)
class Revocation:
    """The run authority revokes ``node``: from round ``from_round`` on, an object it signs
    at a key of a round is refused (``revoked``), and at once one at a key of no round (its
    lease, its done marker). Rounds before stay as the tape holds them. ``signature`` is
    the authority's over the run id, ``node``, ``from_round`` and ``reason``."""

    format: int = FORMAT_VERSION
    node: str
    from_round: int
    reason: str
    signature: str


Record = Manifest | Snapshot | RoundRecord | Lease | Claim | Head
