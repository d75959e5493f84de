"""Properties of the wire codec: valid records round-trip to canonical bytes, and any
other input is a CodecError naming the offending field, never another exception."""

from __future__ import annotations

import array
import json
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gm_core import codec, keys
from gm_core.codec import INT_MAX, INT_MIN, KINDS, MAX_RECORD_BYTES, CodecError
from gm_core.records import (
    CLAIM_LIMIT_2,
    FORMAT_2,
    FORMAT_VERSION,
    FORMATS,
    AlgorithmConfig,
    Alignment,
    Claim,
    Compression,
    FragmentPlan,
    FragmentState,
    FrozenTensor,
    Head,
    Lease,
    Manifest,
    MergeRule,
    Participant,
    Partition,
    PayloadRef,
    Reason,
    Rejection,
    Requests,
    RoundRecord,
    Snapshot,
    TensorSpec,
    Timing,
    Unit,
    WireFormat,
)

JSON = Any  # a decoded JSON document
Path = tuple[str | int, ...]

# --- strategies for valid values -----------------------------------------------------

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True).filter(
    lambda s: ".." not in s
)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
rounds = st.integers(0, keys.ROUND_LIMIT - 1)
attempts = st.integers(0, keys.ATTEMPT_LIMIT - 1)
counts = st.integers(0, INT_MAX)
finite = st.floats(allow_nan=False, allow_infinity=False)
durations = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
texts = st.text(max_size=20)

payload_refs = st.builds(
    lambda r, key_digest, size, digest: PayloadRef(
        key=keys.payload(r, key_digest), size=size, digest=digest
    ),
    rounds,
    digests,
    counts,
    digests,
)
tensor_specs = st.builds(
    TensorSpec,
    name=st.text(min_size=1, max_size=12),
    shape=st.lists(counts, max_size=6).map(tuple),
    dtype=st.text(min_size=1, max_size=8),
)


FRAGMENT_COUNTS = st.integers(1, 8)


def configs(fragments: st.SearchStrategy[int] = FRAGMENT_COUNTS) -> st.SearchStrategy[Any]:
    return st.builds(
        AlgorithmConfig,
        sync_every=st.integers(1, INT_MAX),
        fragments=fragments,
        quorum=st.integers(1, INT_MAX),
        in_flight=st.integers(1, INT_MAX),
        overlap_steps=st.none() | counts,
        alignment=st.sampled_from(Alignment),
        mixing=st.floats(0, 1),
        merge=st.sampled_from(MergeRule),
        embedding_pattern=texts,
        outer_lr=finite,
        outer_momentum=finite,
        partition=st.sampled_from(Partition),
        delta_format=st.sampled_from(WireFormat),
        commit_format=st.sampled_from(WireFormat),
        compression=st.sampled_from(Compression),
        grace_gamma=durations,
        lease_timeout_s=durations,
        takeover_floor_s=durations,
        global_batch_size=st.none() | counts,
        require_signatures=st.booleans(),
        unit=st.sampled_from(Unit),
        trim_fraction=st.floats(0, 0.5, exclude_max=True),
        clip_norm_factor=st.none() | st.floats(1, 1e6),
        outlier_norm_factor=st.none() | st.floats(1, 1e6),
        outlier_cosine=st.none() | st.floats(-1, 1),
        grace_seconds=st.none() | st.floats(0, codec.MAX_GRACE_SECONDS),
        follow=st.integers(0, 8) | counts,
    ).flatmap(_with_thresholds)


def _with_thresholds(config: AlgorithmConfig) -> st.SearchStrategy[AlgorithmConfig]:
    """``config`` with adaptive thresholds in order (``overwrite_below <= carry_above``)."""
    pair = st.tuples(st.floats(-1, 1), st.floats(-1, 1)).map(sorted)
    return pair.map(lambda p: attrs.evolve(config, overwrite_below=p[0], carry_above=p[1]))


frozen_tensors = st.builds(
    FrozenTensor,
    name=st.text(min_size=1, max_size=20),
    shape=st.lists(counts, max_size=3).map(tuple),
    digest=digests,
)
fragment_states = st.builds(
    FragmentState, version=counts, theta=payload_refs, momentum=st.none() | payload_refs
)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    p = draw(st.integers(1, 4))
    names = draw(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=6))
    schema = tuple(attrs.evolve(draw(tensor_specs), name=name) for name in names)
    owner = [draw(st.integers(0, p - 1)) for _ in names]
    plan = FragmentPlan(
        fragments=tuple(
            tuple(n for n, o in zip(names, owner, strict=True) if o == i) for i in range(p)
        )
    )
    return Manifest(
        run_id=draw(ids),
        created_by=draw(ids),
        config=draw(configs(st.just(p))),
        schema=schema,
        plan=plan,
        init=tuple(draw(st.lists(fragment_states, min_size=p, max_size=p))),
        frozen=tuple(
            attrs.evolve(draw(frozen_tensors), name=f"frozen.{i}")
            for i in range(draw(st.integers(0, 3)))
        ),
    )


requests = st.builds(Requests, lists=counts, gets=counts, puts=counts, deletes=counts)
snapshots = st.builds(
    Snapshot,
    learner=ids,
    round=rounds,
    fragment=counts,
    base_version=counts,
    steps=counts,
    tokens=counts,
    step_s=durations,
    schema_digest=texts,
    payload=payload_refs,
    final=st.booleans(),
    signature=texts,
    requests=requests,
)
participants = st.builds(
    Participant,
    learner=ids,
    steps=counts,
    tokens=counts,
    weight=durations,
    base_version=counts,
    final=st.booleans(),
)
rejections = st.builds(Rejection, learner=ids, reason=st.sampled_from(Reason))
timings = st.builds(
    Timing,
    step_s=st.none() | durations,
    quorum_s=st.none() | durations,
    sync_s=st.none() | durations,
)


@st.composite
def round_records(draw: st.DrawFn) -> RoundRecord:
    frontier = tuple(draw(st.lists(fragment_states, min_size=1, max_size=4)))
    fragment = draw(st.integers(0, len(frontier) - 1))
    return RoundRecord(
        round=draw(rounds),
        step=draw(counts),
        fragment=fragment,
        version=frontier[fragment].version,
        participants=tuple(draw(st.lists(participants, max_size=3))),
        rejections=tuple(draw(st.lists(rejections, max_size=3))),
        cosine=draw(st.none() | finite),
        timing=draw(timings),
        quorum_s=draw(durations),
        grace_s=draw(durations),
        theta=draw(payload_refs),
        outer=draw(st.none() | payload_refs),
        update=draw(st.none() | payload_refs),
        closer=draw(ids),
        claim=draw(attempts),
        next_closer=draw(ids),
        frontier=frontier,
        swept_below=draw(rounds),
        requests=draw(requests),
    )


leases = st.builds(
    Lease, node=ids, roles=st.lists(texts, max_size=3).map(tuple), seq=counts, renew_s=durations
)
claims = st.builds(Claim, round=rounds, attempt=attempts, node=ids)
heads = st.builds(Head, round=rounds)

records = st.one_of(manifests(), snapshots, round_records(), leases, claims, heads)
nested_values = st.one_of(
    payload_refs,
    tensor_specs,
    frozen_tensors,
    configs(),
    st.builds(FragmentPlan, fragments=st.lists(st.lists(texts).map(tuple)).map(tuple)),
    fragment_states,
    participants,
    rejections,
    timings,
    requests,
)
values = st.one_of(records, nested_values)

# --- strategies for hostile input ----------------------------------------------------

FIELD_NAMES = sorted({f.name for kind in KINDS for f in attrs.fields(kind)})
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(INT_MAX - 2, INT_MAX + 2),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from([*FIELD_NAMES, *(m.value for m in Reason), "payloads/x"]),
)


def json_containers(inner: st.SearchStrategy[JSON]) -> st.SearchStrategy[JSON]:
    keys_ = st.sampled_from(FIELD_NAMES) | st.text(max_size=5)
    return st.lists(inner, max_size=4) | st.dictionaries(keys_, inner, max_size=5)


json_values = st.recursive(json_scalars, json_containers, max_leaves=20)


def dumps(doc: JSON) -> bytes:
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


def decodes_or_refuses(kind: type[Any], data: bytes) -> CodecError | None:
    """Decode; a failure must be a well-formed CodecError and nothing else."""
    error: CodecError | None = None
    try:
        value = codec.decode(kind, data)
    except CodecError as e:
        error = e
    if error is None:
        assert type(value) is kind
        return None
    assert error.path
    assert error.reason
    assert error.path in str(error)
    assert error.reason in str(error)
    return error


# --- helpers over decoded documents --------------------------------------------------


def render(path: Path) -> str:
    """The codec's path syntax, restated independently."""
    if not path:
        return "$"
    out = ""
    for segment in path:
        if isinstance(segment, int):
            out += f"[{segment}]" if out else f"$[{segment}]"
        elif len(segment) <= 40 and segment.isascii() and segment.isidentifier():
            out += f".{segment}" if out else segment
        else:
            quoted = json.dumps(segment if len(segment) <= 40 else segment[:40] + "...")
            out += f"[{quoted}]" if out else f"$[{quoted}]"
    return out


def nodes(doc: JSON, path: Path = ()) -> Iterator[tuple[Path, JSON]]:
    yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from nodes(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from nodes(value, (*path, index))


def get(doc: JSON, path: Path) -> JSON:
    for segment in path:
        doc = doc[segment]
    return doc


def set_at(doc: JSON, path: Path, value: JSON) -> None:
    get(doc, path[:-1])[path[-1]] = value


def document(value: Any) -> JSON:
    return json.loads(codec.encode(value))


KIND_OF: dict[type, Callable[[JSON], bool]] = {
    type(None): lambda v: v is None,
    bool: lambda v: isinstance(v, bool),
    int: lambda v: type(v) is int,
    float: lambda v: type(v) is float,
    str: lambda v: isinstance(v, str),
    list: lambda v: isinstance(v, list),
    dict: lambda v: isinstance(v, dict),
}
REPLACEMENTS: list[JSON] = [None, True, 7, 2.5, "x", [], {}]


def json_kind(v: JSON) -> type:
    return next(k for k, test in KIND_OF.items() if test(v))


# --- fixed examples ------------------------------------------------------------------

D1 = "0123456789abcdef" * 4
D2 = "fedcba9876543210" * 4
REF = PayloadRef(key=keys.payload(3, D1), size=100, digest=D1)
REF2 = PayloadRef(key=keys.payload(4, D2), size=50, digest=D2)
STATE = FragmentState(version=2, theta=REF, momentum=REF2)

MANIFEST = Manifest(
    run_id="run-1",
    created_by="node-a",
    config=AlgorithmConfig(sync_every=100, fragments=2),
    schema=(
        TensorSpec(name="embed.weight", shape=(10, 4), dtype="float32"),
        TensorSpec(name="block.0.w", shape=(4, 4), dtype="bfloat16"),
        TensorSpec(name="head.bias", shape=(), dtype="float32"),
    ),
    plan=FragmentPlan(fragments=(("embed.weight", "head.bias"), ("block.0.w",))),
    init=(FragmentState(version=0, theta=REF, momentum=None), STATE),
    frozen=(FrozenTensor(name="base.weight", shape=(4, 4), digest=D1),),
)
SNAPSHOT = Snapshot(
    learner="learner-1",
    round=12,
    fragment=1,
    base_version=3,
    steps=50,
    tokens=4096,
    step_s=0.25,
    schema_digest=D2,
    payload=REF,
)
ROUND = RoundRecord(
    round=12,
    step=600,
    fragment=1,
    version=2,
    participants=(
        Participant(learner="l1", steps=50, tokens=4096, weight=2.5, base_version=1, final=False),
        Participant(learner="l2", steps=40, tokens=1000, weight=0.5, base_version=1, final=True),
    ),
    rejections=(Rejection(learner="l3", reason=Reason.STALE),),
    cosine=0.5,
    timing=Timing(step_s=0.25, quorum_s=None, sync_s=1.5),
    quorum_s=3.0,
    grace_s=0.5,
    theta=REF,
    outer=REF2,
    update=None,
    closer="node-a",
    claim=0,
    next_closer="node-b",
    frontier=(FragmentState(version=7, theta=REF2, momentum=None), STATE),
)
LEASE = Lease(node="node-a", roles=("learner", "closer"), seq=9, renew_s=5.0)
CLAIM = Claim(round=12, attempt=2, node="node-b")
HEAD = Head(round=12)
EXAMPLES = [MANIFEST, SNAPSHOT, ROUND, LEASE, CLAIM, HEAD]


# --- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda v: type(v).__name__)
def test_examples_round_trip(value: Any) -> None:
    assert codec.decode(type(value), codec.encode(value)) == value


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_round_trip(value: Any) -> None:
    data = codec.encode(value)
    back = codec.decode(type(value), data)
    assert back == value
    assert codec.encode(back) == data


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_encoding_is_canonical(value: Any) -> None:
    data = codec.encode(value)
    canonical = json.dumps(
        json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert data == canonical
    assert codec.encode(attrs.evolve(value)) == data  # an equal copy, the same bytes
    assert len(data) <= MAX_RECORD_BYTES


@given(records, st.sampled_from([Manifest, Snapshot, RoundRecord, Lease, Claim, Head]))
def test_a_record_is_not_another_kind(value: Any, kind: type[Any]) -> None:
    assume(kind is not type(value))
    with pytest.raises(CodecError):
        codec.decode(kind, codec.encode(value))


def test_wire_format_is_pinned() -> None:
    assert codec.encode(HEAD) == b'{"format":1,"round":12}'
    assert codec.encode(CLAIM) == b'{"attempt":2,"format":1,"node":"node-b","round":12}'
    assert codec.encode(LEASE) == (
        b'{"format":1,"node":"node-a","renew_s":5.0,"roles":["learner","closer"],"seq":9}'
    )
    assert codec.encode(Rejection(learner="l", reason=Reason.ZERO_STEPS)) == (
        b'{"learner":"l","reason":"zero_steps"}'
    )
    assert codec.encode(Timing()) == b'{"quorum_s":null,"step_s":null,"sync_s":null}'


def test_floats_are_written_as_floats() -> None:
    as_int = attrs.evolve(MANIFEST.config, mixing=1, outer_lr=2)
    as_float = attrs.evolve(MANIFEST.config, mixing=1.0, outer_lr=2.0)
    assert codec.encode(as_int) == codec.encode(as_float)
    assert b'"mixing":1.0' in codec.encode(as_int)
    loose = attrs.evolve(ROUND, cosine=1)
    assert b'"cosine":1.0' in codec.encode(loose)


def test_unicode_is_written_as_utf8() -> None:
    lease = attrs.evolve(LEASE, roles=("héllo", "日本"))
    data = codec.encode(lease)
    assert "héllo".encode() in data
    assert codec.decode(Lease, data) == lease


@pytest.mark.parametrize("shape", [(), (0,), (1, 2, 3, 4, 5, 6, 7, 8, 9), (INT_MAX,)])
def test_shapes_of_any_length(shape: tuple[int, ...]) -> None:
    spec = TensorSpec(name="t", shape=shape, dtype="f32")
    assert codec.decode(TensorSpec, codec.encode(spec)) == spec


def test_int_is_accepted_where_float_is_expected() -> None:
    doc = document(SNAPSHOT)
    doc["step_s"] = 3
    value = codec.decode(Snapshot, dumps(doc))
    assert value.step_s == 3.0
    assert type(value.step_s) is float


def test_decode_accepts_bytes_like() -> None:
    data = codec.encode(HEAD)
    assert codec.decode(Head, bytearray(data)) == HEAD
    assert codec.decode(Head, memoryview(data)) == HEAD
    assert codec.decode(Head, array.array("B", data)) == HEAD  # type: ignore[arg-type]


def test_caller_misuse_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        codec.decode(Head, '{"format":1,"round":1}')  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        codec.decode(Head, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        codec.decode(dict, b"{}")  # type: ignore[type-var]
    with pytest.raises(TypeError):
        codec.encode({"format": 1})  # type: ignore[arg-type]


# --- fuzzing: any input is a record or a CodecError ----------------------------------


@given(st.binary(max_size=300), st.sampled_from(KINDS))
def test_arbitrary_bytes(data: bytes, kind: type[Any]) -> None:
    decodes_or_refuses(kind, data)


@given(json_values, st.sampled_from(KINDS))
def test_arbitrary_json(doc: JSON, kind: type[Any]) -> None:
    decodes_or_refuses(kind, dumps(doc))


@given(
    st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=12),
    st.sampled_from(KINDS),
)
def test_arbitrary_objects_of_known_fields(doc: dict[str, JSON], kind: type[Any]) -> None:
    if "format" in attrs.fields_dict(kind):
        doc["format"] = FORMAT_VERSION  # get past the version check into the fields
    decodes_or_refuses(kind, dumps(doc))


@given(st.data())
def test_mutated_json_text(data: st.DataObject) -> None:
    value = data.draw(values)
    text = bytearray(codec.encode(value))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text) - 1))
        text[at] = data.draw(st.sampled_from(b'{}[]",:0123456789.eE-+ntfaluex\\\xff'))
    decodes_or_refuses(type(value), bytes(text))


# --- single-field mutations name the field -------------------------------------------


@st.composite
def mutation_cases(draw: st.DrawFn, of: st.SearchStrategy[Any] = values) -> tuple[type[Any], JSON]:
    value = draw(of)
    return type(value), document(value)


@given(mutation_cases(), st.data())
def test_dropped_field_is_named(case: tuple[type[Any], JSON], data: st.DataObject) -> None:
    kind, doc = case
    added = {name for fields in codec.ADDED_FIELDS.values() for name in fields}
    fields = [p for p, _ in nodes(doc) if p and isinstance(p[-1], str) and p[-1] not in added]
    assume(fields)
    path = data.draw(st.sampled_from(fields))
    del get(doc, path[:-1])[path[-1]]
    error = decodes_or_refuses(kind, dumps(doc))
    assert error is not None
    assert (error.path, error.reason) == (render(path), "missing field")


@given(manifests(), st.sampled_from(Unit))
def test_a_manifest_written_before_unit_is_a_samples_run(manifest: Manifest, unit: Unit) -> None:
    """Format-1 manifests from before ``unit`` existed decode (as the samples runs they were)."""
    doc = document(attrs.evolve(manifest, config=attrs.evolve(manifest.config, unit=unit)))
    assert isinstance(doc, dict)
    assert isinstance(doc["config"], dict)
    assert doc["config"].pop("unit", Unit.SAMPLES.value) == unit.value  # samples: left out
    got = codec.decode(Manifest, dumps(doc))
    assert got.config.unit is Unit.SAMPLES
    assert got == attrs.evolve(manifest, config=attrs.evolve(manifest.config, unit=Unit.SAMPLES))


ROBUST_FIELDS = ("trim_fraction", "clip_norm_factor", "outlier_norm_factor", "outlier_cosine")


@given(manifests())
def test_a_manifest_written_before_robust_merges_is_a_plain_merge(manifest: Manifest) -> None:
    """Manifests from before the robust-merge fields decode with none of them in force."""
    doc = document(manifest)
    assert isinstance(doc, dict)
    assert isinstance(doc["config"], dict)
    for name in ROBUST_FIELDS:
        doc["config"].pop(name, None)  # left out already where it holds its absent value
    got = codec.decode(Manifest, dumps(doc))
    plain = attrs.evolve(
        manifest.config,
        trim_fraction=0.25,
        clip_norm_factor=None,
        outlier_norm_factor=None,
        outlier_cosine=None,
    )
    assert got == attrs.evolve(manifest, config=plain)


@given(manifests())
def test_a_manifest_written_before_grace_seconds_is_adaptive(manifest: Manifest) -> None:
    doc = document(manifest)
    assert isinstance(doc, dict)
    assert isinstance(doc["config"], dict)
    doc["config"].pop("grace_seconds", None)
    got = codec.decode(Manifest, dumps(doc))
    adaptive = attrs.evolve(manifest.config, grace_seconds=None)
    assert got == attrs.evolve(manifest, config=adaptive)


@given(manifests())
def test_a_manifest_written_before_adaptive_alignment_has_its_default_thresholds(
    manifest: Manifest,
) -> None:
    doc = document(manifest)
    assert isinstance(doc, dict)
    assert isinstance(doc["config"], dict)
    doc["config"].pop("carry_above", None)
    doc["config"].pop("overwrite_below", None)
    got = codec.decode(Manifest, dumps(doc))
    defaults = attrs.evolve(manifest.config, carry_above=0.6, overwrite_below=0.4)
    assert got == attrs.evolve(manifest, config=defaults)


@given(manifests())
def test_a_manifest_written_before_follow_never_publishes_early(manifest: Manifest) -> None:
    doc = document(manifest)
    assert isinstance(doc, dict)
    assert isinstance(doc["config"], dict)
    doc["config"].pop("follow", None)
    got = codec.decode(Manifest, dumps(doc))
    assert got == attrs.evolve(manifest, config=attrs.evolve(manifest.config, follow=0))


def test_a_negative_follow_is_refused() -> None:
    doc = document(MANIFEST.config)
    assert isinstance(doc, dict)
    doc["follow"] = -1
    assert refused(AlgorithmConfig, dumps(doc)).path == "follow"


@pytest.mark.parametrize(
    ("carry_above", "overwrite_below", "path", "reason"),
    [
        (0.3, 0.5, "carry_above", "overwrite_below <= carry_above"),
        (1.5, 0.4, "carry_above", "[-1, 1]"),
        (0.6, -1.01, "overwrite_below", "[-1, 1]"),
        (0.2, 0.2000001, "carry_above", "overwrite_below <= carry_above"),
    ],
)
def test_adaptive_thresholds_out_of_order_or_range_are_refused(
    carry_above: float, overwrite_below: float, path: str, reason: str
) -> None:
    """A threshold out of [-1, 1] is named itself; two in range but out of order name
    ``carry_above``."""
    doc = document(MANIFEST.config)
    assert isinstance(doc, dict)
    doc["carry_above"], doc["overwrite_below"] = carry_above, overwrite_below
    error = refused(AlgorithmConfig, dumps(doc))
    assert error.path == path
    assert reason in error.reason


def written_iff_meaningful(obj: Any, doc: JSON) -> None:
    assert isinstance(doc, dict)
    for name, absent in codec.ADDED_FIELDS.get(type(obj), {}).items():
        held = json.loads(json.dumps(codec._converter.unstructure(getattr(obj, name))))
        assert (name in doc) == (held != absent), name


@given(manifests())
def test_added_fields_are_written_only_when_they_mean_something(manifest: Manifest) -> None:
    """A field added after format 1 that holds what its absence means is left out, so an
    object that uses no newer feature is byte for byte what older readers know."""
    doc = json.loads(codec.encode(manifest))
    written_iff_meaningful(manifest, doc)
    written_iff_meaningful(manifest.config, doc["config"])
    assert codec.decode(Manifest, codec.encode(manifest)) == manifest
    for live in ((), ("a", "b")):
        record = attrs.evolve(ROUND, live=live)
        written_iff_meaningful(record, json.loads(codec.encode(record)))
        assert codec.decode(RoundRecord, codec.encode(record)) == record


@pytest.mark.parametrize("seconds", [-1.0, 86_400.5, float("nan"), float("inf")])
def test_a_grace_window_out_of_range_is_refused(seconds: float) -> None:
    doc = document(MANIFEST.config)
    assert isinstance(doc, dict)
    doc["grace_seconds"] = seconds
    error = refused(AlgorithmConfig, dumps(doc))
    assert error.path == "grace_seconds"


@given(
    mutation_cases(),
    st.data(),
    st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True) | st.text(max_size=50),
    json_values,
)
def test_added_field_is_named(
    case: tuple[type[Any], JSON], data: st.DataObject, name: str, extra: JSON
) -> None:
    kind, doc = case
    objects = [p for p, v in nodes(doc) if isinstance(v, dict) and name not in v]
    assume(objects)
    path = data.draw(st.sampled_from(objects))
    get(doc, path)[name] = extra
    error = decodes_or_refuses(kind, dumps(doc))
    assert error is not None
    assert (error.path, error.reason) == (render((*path, name)), "unknown field")


@given(mutation_cases(), st.data())
def test_changed_type_is_named(case: tuple[type[Any], JSON], data: st.DataObject) -> None:
    kind, doc = case
    path, old = data.draw(st.sampled_from([(p, v) for p, v in nodes(doc) if p]))
    new = data.draw(
        st.sampled_from([r for r in REPLACEMENTS if json_kind(r) is not json_kind(old)])
    )
    set_at(doc, path, new)
    error = decodes_or_refuses(kind, dumps(doc))
    # A different JSON kind is wrong for the field, except where the field may hold
    # it: null in an optional field, an integer in a float field, or anything where
    # the old null hides which type the field has.
    may_pass = new is None or old is None or (type(old) is float and type(new) is int)
    if error is None:
        assert may_pass
    elif old is None and new == {}:
        assert error.path == render(path) or error.path.startswith(render(path) + ".")
    else:
        assert error.path == render(path)


@given(mutation_cases(records), json_values)
def test_changed_format_is_a_version_error(case: tuple[type[Any], JSON], version: JSON) -> None:
    kind, doc = case
    assume(not (type(version) is int and version in FORMATS))
    doc["format"] = version
    doc["field_from_the_future"] = [1, 2, 3]
    error = decodes_or_refuses(kind, dumps(doc))
    assert error is not None
    assert error.path == "format"
    assert error.reason.startswith("unknown format version")


def test_type_changes_the_field_allows() -> None:
    # The cases test_changed_type_is_named lets pass, pinned: null in an optional
    # field, an integer in a float field (unless its range refuses it).
    doc = document(ROUND)
    doc["outer"] = None
    doc["cosine"] = 7
    assert codec.decode(RoundRecord, dumps(doc)) == attrs.evolve(ROUND, outer=None, cosine=7.0)
    doc = document(MANIFEST.config)
    doc["mixing"] = 7
    assert refused(AlgorithmConfig, dumps(doc)).path == "mixing"


# --- the document as a whole ---------------------------------------------------------


def refused(kind: type[Any], data: bytes) -> CodecError:
    error = decodes_or_refuses(kind, data)
    assert error is not None
    return error


def test_size_limit_is_checked_before_parsing() -> None:
    error = refused(Head, b"\xff" * (MAX_RECORD_BYTES + 1))
    assert error.path == "$"
    assert "limit" in error.reason
    assert str(MAX_RECORD_BYTES + 1) in error.reason


def test_size_limit_is_inclusive() -> None:
    data = codec.encode(HEAD)
    padded = data + b" " * (MAX_RECORD_BYTES - len(data))
    assert codec.decode(Head, padded) == HEAD
    assert "limit" in refused(Head, padded + b" ").reason


def test_encode_refuses_oversized_records() -> None:
    big = attrs.evolve(LEASE, roles=("x" * MAX_RECORD_BYTES,))
    with pytest.raises(CodecError, match="limit"):
        codec.encode(big)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not valid JSON"),
        (b"   ", "not valid JSON"),
        (b"\xff{}", "UTF-8"),
        (b'{"format":1,"round":"\xc3"}', "UTF-8"),
        (b'\xef\xbb\xbf{"format":1,"round":1}', "not valid JSON"),
        (b'{"format":1,"round":1}x', "not valid JSON"),
        (b'{"format":1,"round":1', "not valid JSON"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"a":' * 100_000, "nested too deeply"),
        (b"[]", "expected a JSON object, got an array"),
        (b'"head"', "expected a JSON object, got a string"),
        (b"12", "expected a JSON object, got an integer"),
        (b"null", "expected a JSON object, got null"),
        (b"NaN", "NaN and Infinity are not JSON numbers"),
        (b'{"format":1,"round":1,"round":2}', "repeats the key 'round'"),
    ],
)
def test_whole_document_errors(data: bytes, reason: str) -> None:
    error = refused(Head, data)
    assert error.path == "$"
    assert reason in error.reason


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "None"),
        (3, "3"),
        (0, "0"),
        (-1, "-1"),
        ("1", "'1'"),
        (1.0, "1.0"),
        (True, "True"),
        ([1], "[1]"),
    ],
)
def test_format_must_be_exactly_the_version(value: JSON, shown: str) -> None:
    doc = document(HEAD)
    doc["format"] = value
    error = refused(Head, dumps(doc))
    assert error.path == "format"
    assert error.reason.startswith(f"unknown format version {shown}")


def test_format_is_checked_before_anything_else() -> None:
    future = b'{"format":3,"round":"soon","shiny":{"new":[1]}}'
    error = refused(Head, future)
    assert (error.path, error.reason.split(" (")[0]) == ("format", "unknown format version 3")
    assert refused(Head, b'{"round":1}').path == "format"
    assert refused(Head, b'{"format":NaN,"round":1}').path == "format"


def test_huge_numbers_are_named_by_their_field() -> None:
    # Beyond Python's own int conversion limit (4300 digits), which raises ValueError.
    error = refused(Head, b'{"format":1,"round":' + b"9" * 5000 + b"}")
    assert (error.path, error.reason) == ("round", "integer out of the 64-bit range")
    error = refused(Snapshot, codec.encode(SNAPSHOT).replace(b'"step_s":0.25', b'"step_s":1e999'))
    assert (error.path, error.reason) == ("step_s", "number out of range")


def test_duplicate_keys_are_named_by_their_object() -> None:
    data = codec.encode(ROUND).replace(b'"timing":{', b'"timing":{"sync_s":1.0,', 1)
    error = refused(RoundRecord, data)
    assert error.path == "timing"
    assert "repeats the key 'sync_s'" in error.reason


# --- field errors ----------------------------------------------------------------------

FIELD_CASES: list[tuple[Any, Path, JSON, str]] = [
    # (valid record, where to write, what JSON to write there, words of the reason)
    (HEAD, ("round",), "3", "expected an integer, got a string"),
    (HEAD, ("round",), True, "expected an integer, got a boolean"),
    (HEAD, ("round",), 3.0, "expected an integer, got a number"),
    (HEAD, ("round",), 2**63, "64-bit"),
    (HEAD, ("round",), -(2**63) - 1, "64-bit"),
    (HEAD, ("round",), 10**30, "64-bit"),
    (HEAD, ("round",), float("nan"), "NaN and Infinity"),
    (HEAD, ("round",), -1, "must be in [0, 1000000000000)"),
    (HEAD, ("round",), keys.ROUND_LIMIT, "must be in [0, 1000000000000)"),
    (SNAPSHOT, ("step_s",), float("inf"), "NaN and Infinity"),
    (SNAPSHOT, ("step_s",), False, "expected a number, got a boolean"),
    (SNAPSHOT, ("step_s",), "0.5", "expected a number, got a string"),
    (SNAPSHOT, ("step_s",), -0.5, "at least 0"),
    (SNAPSHOT, ("learner",), 5, "expected a string, got an integer"),
    (SNAPSHOT, ("learner",), "../etc", "not a valid id"),
    (SNAPSHOT, ("learner",), "a/b", "not a valid id"),
    (SNAPSHOT, ("final",), 1, "expected a boolean, got an integer"),
    (SNAPSHOT, ("steps",), -1, "at least 0"),
    (SNAPSHOT, ("tokens",), -1, "at least 0"),
    (SNAPSHOT, ("payload",), [], "expected an object, got an array"),
    (SNAPSHOT, ("payload", "key"), "rounds/000000000001.json", "not a payload key"),
    (SNAPSHOT, ("payload", "key"), "../payloads/x.st", "unknown folder"),
    (SNAPSHOT, ("payload", "size"), -1, "at least 0"),
    (SNAPSHOT, ("payload", "digest"), D1.upper(), "64 lowercase hex"),
    (SNAPSHOT, ("payload", "digest"), D1[:-1], "64 lowercase hex"),
    (LEASE, ("roles",), "ab", "expected an array, got a string"),
    (LEASE, ("roles",), {"a": 1}, "expected an array, got an object"),
    (LEASE, ("roles", 1), 3, "expected a string, got an integer"),
    (LEASE, ("seq",), -1, "at least 0"),
    (LEASE, ("node",), "", "not a valid id"),
    (CLAIM, ("attempt",), keys.ATTEMPT_LIMIT, "must be in [0, 10000)"),
    (CLAIM, ("node",), "-rf", "not a valid id"),
    (ROUND, ("rejections", 0, "reason"), "bored", "'bored' is not one of"),
    (ROUND, ("rejections", 0, "reason"), "STALE", "is not one of"),
    (ROUND, ("rejections", 0, "reason"), 2, "expected a string, got an integer"),
    (ROUND, ("rejections", 0, "learner"), "..", "not a valid id"),
    (ROUND, ("participants", 1, "weight"), "x", "expected a number, got a string"),
    (ROUND, ("participants", 1, "weight"), -1.0, "at least 0"),
    (ROUND, ("participants", 1, "learner"), "a" * 65, "not a valid id"),
    (ROUND, ("participants", 1), None, "expected an object, got null"),
    (ROUND, ("participants",), None, "expected an array, got null"),
    (ROUND, ("cosine",), "high", "expected a number, got a string"),
    (ROUND, ("timing", "sync_s"), -1.0, "at least 0"),
    (ROUND, ("quorum_s",), -1.0, "at least 0"),
    (ROUND, ("grace_s",), -1.0, "at least 0"),
    (ROUND, ("closer",), "x/y", "not a valid id"),
    (ROUND, ("next_closer",), ".x", "not a valid id"),
    (ROUND, ("claim",), -1, "must be in [0, 4294967296)"),
    (ROUND, ("outer", "key"), "junk", "not a known top-level object"),
    (ROUND, ("frontier", 1, "momentum", "digest"), "z" * 64, "64 lowercase hex"),
    (ROUND, ("frontier", 0, "version"), -1, "at least 0"),
    (ROUND, ("frontier",), [], "must not be empty"),
    (ROUND, ("fragment",), 2, "outside a frontier of 2"),
    (ROUND, ("version",), 7, "differs from frontier[1].version 2"),
    (MANIFEST, ("run_id",), "a..b", "not a valid id"),
    (MANIFEST, ("created_by",), "", "not a valid id"),
    (MANIFEST, ("config", "sync_every"), 0, "at least 1"),
    (MANIFEST, ("config", "fragments"), 0, "at least 1"),
    (MANIFEST, ("config", "quorum"), 0, "at least 1"),
    (MANIFEST, ("config", "in_flight"), 0, "at least 1"),
    (MANIFEST, ("config", "overlap_steps"), -1, "at least 0"),
    (MANIFEST, ("config", "mixing"), 1.5, "must be in [0, 1]"),
    (MANIFEST, ("config", "mixing"), -0.1, "must be in [0, 1]"),
    (MANIFEST, ("config", "global_batch_size"), -1, "at least 0"),
    (MANIFEST, ("config", "lease_timeout_s"), -1, "at least 0"),
    (MANIFEST, ("config", "alignment"), "merge", "is not one of"),
    (MANIFEST, ("config", "require_signatures"), "yes", "expected a boolean"),
    (MANIFEST, ("config", "unit"), "bytes", "is not one of"),
    (MANIFEST, ("config", "unit"), None, "expected a string"),
    (MANIFEST, ("config", "merge"), "mode", "is not one of"),
    (MANIFEST, ("config", "trim_fraction"), 0.5, "must be in [0, 0.5)"),
    (MANIFEST, ("config", "trim_fraction"), -0.1, "must be in [0, 0.5)"),
    (MANIFEST, ("config", "clip_norm_factor"), 0.5, "at least 1.0"),
    (MANIFEST, ("config", "outlier_norm_factor"), 0.9, "at least 1.0"),
    (MANIFEST, ("config", "outlier_cosine"), 1.5, "must be in [-1, 1]"),
    (MANIFEST, ("schema", 0, "shape", 1), -4, "at least 0"),
    (MANIFEST, ("schema", 0, "shape", 1), 4.0, "expected an integer, got a number"),
    (MANIFEST, ("schema", 0, "name"), "", "must not be empty"),
    (MANIFEST, ("schema", 2, "name"), "embed.weight", "appears twice"),
    (MANIFEST, ("plan", "fragments", 1, 0), "ghost", "not in the schema"),
    (MANIFEST, ("plan", "fragments", 1, 0), "embed.weight", "more than one fragment"),
    (MANIFEST, ("plan", "fragments", 1, 0), ["block.0.w"], "expected a string, got an array"),
    (MANIFEST, ("plan", "fragments"), [["embed.weight", "head.bias", "block.0.w"]], "has 1"),
    (MANIFEST, ("init",), [], "has 0 fragments"),
]


@pytest.mark.parametrize(
    ("value", "path", "new", "reason"),
    FIELD_CASES,
    ids=[f"{type(c[0]).__name__}:{render(c[1])}={c[2]!r:.20}" for c in FIELD_CASES],
)
def test_field_errors_name_the_field(value: Any, path: Path, new: JSON, reason: str) -> None:
    doc = document(value)
    set_at(doc, path, new)
    error = refused(type(value), dumps(doc))
    assert error.path == render(path)
    assert reason in error.reason


def test_every_tensor_must_be_planned() -> None:
    doc = document(MANIFEST)
    doc["plan"]["fragments"][0] = ["embed.weight"]
    error = refused(Manifest, dumps(doc))
    assert (error.path, error.reason) == ("schema[2].name", "tensor is in no fragment")


def test_errors_are_reported_in_declaration_order() -> None:
    doc = document(ROUND)
    doc["next_closer"] = 1
    doc["step"] = "late"
    doc["participants"][1]["weight"] = None
    assert refused(RoundRecord, dumps(doc)).path == "step"
    doc["step"] = 1
    assert refused(RoundRecord, dumps(doc)).path == "participants[1].weight"


def test_missing_fields_come_before_wrong_types() -> None:
    doc = document(SNAPSHOT)
    doc["round"] = "x"
    del doc["signature"]  # has a default in Python, but the wire requires it
    error = refused(Snapshot, dumps(doc))
    assert (error.path, error.reason) == ("signature", "missing field")


# --- encode refuses what decode would refuse -------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (attrs.evolve(SNAPSHOT, step_s=math.nan), "step_s"),
        (attrs.evolve(SNAPSHOT, step_s=-math.inf), "step_s"),
        (attrs.evolve(SNAPSHOT, steps=-3), "steps"),
        (attrs.evolve(SNAPSHOT, steps=True), "steps"),
        (attrs.evolve(SNAPSHOT, round="3"), "round"),  # type: ignore[arg-type]
        (attrs.evolve(SNAPSHOT, learner="../x"), "learner"),
        (attrs.evolve(SNAPSHOT, signature="\ud800"), "signature"),
        (attrs.evolve(HEAD, round=INT_MAX + 1), "round"),
        (attrs.evolve(ROUND, fragment=5), "fragment"),
        (attrs.evolve(LEASE, roles=("a", 1)), "roles[1]"),  # type: ignore[arg-type]
        (attrs.evolve(MANIFEST, config=attrs.evolve(MANIFEST.config, mixing=2.0)), "config.mixing"),
        (attrs.evolve(LEASE, roles=["a"]), "$"),  # type: ignore[arg-type]
        (attrs.evolve(LEASE, roles=frozenset({"a"})), "$"),  # type: ignore[arg-type]
    ],
)
def test_encode_refuses_invalid_records(value: Any, path: str) -> None:
    with pytest.raises(CodecError) as info:
        codec.encode(value)
    assert info.value.path == path


def test_int_min_is_a_valid_integer_where_sign_is_free() -> None:
    doc = document(ROUND)
    doc["cosine"] = INT_MIN
    assert codec.decode(RoundRecord, dumps(doc)).cosine == float(INT_MIN)


# --- the error type ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("", '$[""]'),
        ("a.b", '$["a.b"]'),
        ("[0]", '$["[0]"]'),
        ("x" * 50, '$["' + "x" * 40 + '..."]'),
        ("é", '$["\\u00e9"]'),
    ],
)
def test_unknown_keys_are_quoted_in_paths(name: str, path: str) -> None:
    doc = document(HEAD)
    doc[name] = 1
    assert refused(Head, dumps(doc)).path == path
    doc = document(ROUND)
    doc["timing"][name] = 1
    assert refused(RoundRecord, dumps(doc)).path == "timing" + path[1:]


def test_codec_error_names_path_and_reason_and_pickles() -> None:
    error = CodecError("participants[2].weight", "expected a number, got a string")
    assert isinstance(error, ValueError)
    assert str(error) == "participants[2].weight: expected a number, got a string"
    again = pickle.loads(pickle.dumps(error))
    assert (again.path, again.reason) == (error.path, error.reason)


def test_a_tensor_both_synced_and_frozen_is_refused() -> None:
    doc = document(MANIFEST)
    doc["frozen"][0]["name"] = "embed.weight"
    data = json.dumps(doc).encode()
    error = refused(Manifest, data)
    assert error.path == "frozen[0].name"
    assert "both synced and frozen" in error.reason


@given(records)
def test_a_record_declares_the_runs_format_and_reads_back_the_same_value(value: Any) -> None:
    """Format 2 is a number on the wire: the same value, whichever format carried it (a
    manifest's own ``format`` is the run's and is kept)."""
    for version in FORMATS:
        data = codec.encode(value, version)
        assert codec.decode(type(value), data) == value
        declared = value.format if isinstance(value, Manifest) else version
        assert codec.declared_format(data) == declared
        assert codec.format_number(data) == declared  # the scan finds what a parse does


@given(st.sampled_from(["claim", "record"]), st.integers(keys.ATTEMPT_LIMIT, CLAIM_LIMIT_2 - 1))
def test_claim_attempts_past_format_1s_four_digits_are_format_2s_alone(
    kind: str, attempt: int
) -> None:
    """spec/protocol.md §16.4.4: a format-2 body may name any attempt below ``2^32`` (room for
    the random jump past a claim flood); a format-1 body stays below ``10^4``, which its
    numbered keys and every format-1 reader hold it to, both ways (decode and encode)."""
    value: Any = (
        attrs.evolve(CLAIM, attempt=attempt)
        if kind == "claim"
        else attrs.evolve(ROUND, claim=attempt)
    )
    data = codec.encode(value, FORMAT_2)
    assert codec.decode(type(value), data) == value
    codec.encode(value)  # in memory (no format named): its digest is computable
    field = "attempt" if kind == "claim" else "claim"
    with pytest.raises(CodecError, match=f"{field}: must be in \\[0, 10000\\)"):
        codec.encode(value, FORMAT_VERSION)
    one = data.replace(b'"format":2', b'"format":1')
    with pytest.raises(CodecError, match=f"{field}: must be in \\[0, 10000\\)"):
        codec.decode(type(value), one)
    with pytest.raises(CodecError, match="must be in \\[0, 4294967296\\)"):
        codec.encode(attrs.evolve(value, **{field: CLAIM_LIMIT_2}), FORMAT_2)
