"""Property tests for gm_core.manifest: adopting a run names every difference, and only those."""

from __future__ import annotations

import enum
from typing import Any

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gm_core import plan
from gm_core.manifest import (
    MAX_LISTED,
    digest,
    frozen_mismatch,
    manifest_mismatch,
    natural_format,
    parse_digest,
    pin_mismatch,
    wire_schema,
    wire_wider_than_params,
)
from gm_core.records import (
    AlgorithmConfig,
    Alignment,
    Compression,
    FragmentState,
    FrozenTensor,
    Manifest,
    MergeRule,
    Partition,
    PayloadRef,
    TensorSpec,
    Unit,
    WireFormat,
)
from gm_core.tape import chain_digest

REF = PayloadRef(key="payloads/000000000000/" + "0" * 64 + ".st", size=1, digest="0" * 64)

names = st.from_regex(r"[a-z]{1,6}(\.[a-z0-9]{1,4}){0,2}", fullmatch=True)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)
dtypes = st.sampled_from(["F32", "F16", "BF16"])


@st.composite
def schemas(draw: st.DrawFn) -> tuple[TensorSpec, ...]:
    unique = draw(st.lists(names, min_size=2, max_size=6, unique=True))
    return tuple(TensorSpec(name=n, shape=draw(shapes), dtype=draw(dtypes)) for n in unique)


configs = st.builds(
    AlgorithmConfig,
    sync_every=st.integers(1, 50),
    fragments=st.just(2),
    quorum=st.integers(1, 4),
    in_flight=st.integers(1, 3),
    overlap_steps=st.none() | st.integers(0, 10),
    alignment=st.sampled_from(list(Alignment)),
    merge=st.sampled_from(list(MergeRule)),
    partition=st.just(Partition.BYTES),
    delta_format=st.sampled_from(list(WireFormat)),
    compression=st.sampled_from(list(Compression)),
    unit=st.sampled_from(list(Unit)),
)


def manifest(config: AlgorithmConfig, schema: tuple[TensorSpec, ...], **over: Any) -> Manifest:
    fields: dict[str, Any] = {
        "run_id": "run",
        "created_by": "n0",
        "config": config,
        "schema": schema,
        "plan": plan.make_plan(schema, config),
        "init": tuple(FragmentState(version=0, theta=REF, momentum=None) for _ in range(2)),
    }
    fields.update(over)
    return Manifest(**fields)


@given(configs, schemas(), st.text(max_size=8), st.sampled_from(["n0", "n1", "other"]))
def test_same_config_and_schema_adopt_whoever_created_it(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], run_id: str, creator: str
) -> None:
    theirs = manifest(config, schema, run_id=run_id or "r", created_by=creator, init=())
    assert manifest_mismatch(manifest(config, schema), theirs) is None


CHANGES: dict[str, Any] = {
    "sync_every": lambda v: v + 1,
    "quorum": lambda v: v + 1,
    "in_flight": lambda v: v + 1,
    "overlap_steps": lambda v: 3 if v is None else None,
    "alignment": lambda v: Alignment.CARRY if v is not Alignment.CARRY else Alignment.BLEND,
    "mixing": lambda v: v / 2,
    "merge": lambda v: MergeRule.RDA if v is MergeRule.MEAN else MergeRule.MEAN,
    "outer_lr": lambda v: v + 0.1,
    "outer_momentum": lambda v: v / 2,
    "delta_format": lambda v: WireFormat.F16 if v is not WireFormat.F16 else WireFormat.BF16,
    "commit_format": lambda v: WireFormat.BF16,
    "compression": lambda v: Compression.ZSTD if v is Compression.NONE else Compression.NONE,
    "lease_timeout_s": lambda v: v + 1,
    "global_batch_size": lambda v: 64 if v is None else v * 2,
    "unit": lambda v: Unit.TOKENS if v is Unit.SAMPLES else Unit.SAMPLES,
}


def shown(value: Any) -> str:
    """How a mismatch message writes a value: as the user spells it (an enum by its value)."""
    return repr(value.value if isinstance(value, enum.Enum) else value)


@given(configs, schemas(), st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, unique=True))
def test_every_changed_config_field_is_named_with_both_values(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], changed: list[str]
) -> None:
    mine = attrs.evolve(config, **{name: CHANGES[name](getattr(config, name)) for name in changed})
    message = manifest_mismatch(manifest(mine, schema), manifest(config, schema))
    assert message is not None
    for name in attrs.fields_dict(AlgorithmConfig):
        assert (f"config.{name}:" in message) == (name in changed), (name, message)
    for name in changed:
        assert f"the run has {shown(getattr(config, name))}" in message
        assert f"this node has {shown(getattr(mine, name))}" in message


@given(configs, schemas(), st.data())
def test_a_changed_tensor_is_named(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(schema) - 1))
    old = schema[index]
    new = attrs.evolve(old, shape=(*old.shape, 2))
    mine = (*schema[:index], new, *schema[index + 1 :])
    message = manifest_mismatch(manifest(config, mine), manifest(config, schema))
    assert message is not None
    assert repr(old.name) in message
    assert f"{old.dtype}{list(old.shape)} in the run" in message


@given(configs, schemas(), st.data())
def test_missing_and_extra_tensors_are_named_on_their_side(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(schema) - 1))
    dropped = schema[:index] + schema[index + 1 :]
    extra = (*schema, TensorSpec(name="zz.extra", shape=(1,), dtype="F32"))
    if len(dropped) >= 2:
        lacking = manifest_mismatch(manifest(config, dropped), manifest(config, schema))
        assert lacking is not None
        assert f"tensors this node lacks: {schema[index].name}" in lacking
    surplus = manifest_mismatch(manifest(config, extra), manifest(config, schema))
    assert surplus is not None
    assert "tensors the run lacks: zz.extra" in surplus


@given(configs, schemas())
def test_another_tensor_order_is_a_mismatch(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...]
) -> None:
    message = manifest_mismatch(manifest(config, schema[::-1]), manifest(config, schema))
    assert message is not None
    assert "another order" in message


def test_long_lists_are_counted_not_spelled_out() -> None:
    config = AlgorithmConfig(sync_every=4, fragments=2)
    schema = tuple(TensorSpec(name=f"t{i}", shape=(2,), dtype="F32") for i in range(12))
    message = manifest_mismatch(manifest(config, schema[:2]), manifest(config, schema))
    assert message is not None
    assert f"and {10 - MAX_LISTED} more" in message


def test_format_and_plan_differences_are_named() -> None:
    config = AlgorithmConfig(sync_every=4, fragments=2)
    schema = (
        TensorSpec(name="a", shape=(3,), dtype="F32"),
        TensorSpec(name="b", shape=(2,), dtype="F32"),
    )
    mine = manifest(config, schema)
    assert manifest_mismatch(mine, attrs.evolve(mine, format=2)) is None  # a format it reads
    newer = attrs.evolve(mine, format=3)
    assert "manifest format: the run has 3" in (manifest_mismatch(mine, newer) or "")
    swapped = attrs.evolve(mine, plan=attrs.evolve(mine.plan, fragments=mine.plan.fragments[::-1]))
    assert "fragment plan differs" in (manifest_mismatch(mine, swapped) or "")


@pytest.mark.parametrize("order", [False, True])
def test_mismatch_is_symmetric_in_whether_it_exists(order: bool) -> None:
    config = AlgorithmConfig(sync_every=4, fragments=2)
    schema = (
        TensorSpec(name="a", shape=(3,), dtype="F32"),
        TensorSpec(name="b", shape=(2,), dtype="F32"),
    )
    a, b = manifest(config, schema), manifest(attrs.evolve(config, quorum=2), schema)
    if order:
        a, b = b, a
    assert manifest_mismatch(a, b) is not None
    assert manifest_mismatch(b, a) is not None


@given(configs, schemas(), st.sampled_from(["module.", "_orig_mod.", "base_model.model."]))
def test_a_prefix_only_difference_is_named_with_the_fix(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], prefix: str
) -> None:
    wrapped = tuple(attrs.evolve(t, name=prefix + t.name) for t in schema)
    for mine, theirs, whose in ((wrapped, schema, "this node's"), (schema, wrapped, "the run's")):
        problem = manifest_mismatch(manifest(config, mine), manifest(config, theirs))
        assert problem is not None
        assert f"only a prefix differs: {whose} tensor names all start with {prefix!r}" in problem


@given(configs, schemas())
def test_no_prefix_hint_when_names_differ_otherwise(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...]
) -> None:
    renamed = (attrs.evolve(schema[0], name="x." + schema[0].name), *schema[1:])
    problem = manifest_mismatch(manifest(config, renamed), manifest(config, schema))
    assert problem is not None
    assert "prefix" not in problem


frozen_tensors = st.lists(
    st.builds(FrozenTensor, name=names, shape=shapes, digest=st.sampled_from(["0" * 64, "1" * 64])),
    max_size=6,
    unique_by=lambda t: t.name,
).map(tuple)


@given(configs, schemas(), frozen_tensors, frozen_tensors)
def test_frozen_differences_are_named_and_only_those(
    config: AlgorithmConfig,
    schema: tuple[TensorSpec, ...],
    mine: tuple[FrozenTensor, ...],
    theirs: tuple[FrozenTensor, ...],
) -> None:
    problems = frozen_mismatch(mine, theirs)
    assert (problems == []) == (mine == theirs or set(mine) == set(theirs))
    ours, run = {t.name: t for t in mine}, {t.name: t for t in theirs}
    text = "; ".join(problems)
    assert ("frozen tensors this node lacks" in text) == bool(run.keys() - ours.keys())
    assert ("frozen tensors the run lacks" in text) == bool(ours.keys() - run.keys())
    changed = any(ours[n] != run[n] for n in ours.keys() & run.keys())
    assert ("differ from the run's base" in text) == changed
    different = manifest_mismatch(
        manifest(config, schema, frozen=mine), manifest(config, schema, frozen=theirs)
    )
    assert (different is None) == (problems == [])


@given(st.lists(dtypes, min_size=1, max_size=5))
def test_the_natural_format_never_widens_a_parameter(held_dtypes: list[str]) -> None:
    held = tuple(TensorSpec(name=f"t{i}", shape=(2,), dtype=d) for i, d in enumerate(held_dtypes))
    fmt = natural_format(held)
    if len(set(held_dtypes)) == 1:
        assert fmt.value == held_dtypes[0]
    else:
        assert fmt is WireFormat.F32
    assert wire_schema(held) == tuple(attrs.evolve(t, dtype="F32") for t in held)
    narrowest = AlgorithmConfig(sync_every=1, fragments=1, delta_format=fmt, commit_format=fmt)
    assert wire_wider_than_params(narrowest, held) is None
    wide = attrs.evolve(narrowest, delta_format=WireFormat.F32)
    warning = wire_wider_than_params(wide, held)
    assert (warning is None) == (fmt is WireFormat.F32)
    quantized = attrs.evolve(narrowest, delta_format=WireFormat.F4_E2M1)
    assert wire_wider_than_params(quantized, held) is None


# --- pinning (spec/protocol.md §16.5.2) -------------------------------------------------

hex_digests = st.text("0123456789abcdef", min_size=64, max_size=64)


@given(configs, schemas())
def test_a_pinned_manifest_is_adopted(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...]
) -> None:
    m = manifest(config, schema)
    assert pin_mismatch(digest(m), m) is None
    assert digest(m) == chain_digest(m)  # what a chained run's round 0 names as prev


OTHER_REF = PayloadRef(key="payloads/000000000000/" + "1" * 64 + ".st", size=1, digest="1" * 64)
FORGERIES: dict[str, Any] = {
    "run_id": "forged",
    "created_by": "attacker",
    "init": tuple(FragmentState(version=0, theta=OTHER_REF, momentum=None) for _ in range(2)),
    "chained": False,
}


@given(configs, schemas(), st.sampled_from(sorted(FORGERIES)))
def test_a_manifest_that_differs_in_anything_is_refused_naming_both_digests(
    config: AlgorithmConfig, schema: tuple[TensorSpec, ...], field: str
) -> None:
    """Even what config and schema leave out (who created it, its initial model): a forger
    who copies the run's config and schema and brings its own ``init`` is refused."""
    real = manifest(config, schema, chained=True)
    forged = attrs.evolve(real, **{field: FORGERIES[field]})
    assert manifest_mismatch(real, forged) is None  # what adoption alone cannot see
    problem = pin_mismatch(digest(real), forged)
    assert problem is not None
    assert digest(real) in problem
    assert digest(forged) in problem


@given(hex_digests, st.sampled_from(["", " ", "\n"]), st.booleans())
def test_a_digest_is_read_as_a_person_copied_it(text: str, pad: str, upper: bool) -> None:
    shown = text.upper() if upper else text
    assert parse_digest(f"{pad}{shown}{pad}") == text


def is_digest(text: str) -> bool:
    cleaned = text.strip().lower()
    return len(cleaned) == 64 and set(cleaned) <= set("0123456789abcdef")


@given(st.text(max_size=70) | st.text("0123456789abcdefgG ", min_size=60, max_size=68))
def test_anything_else_is_not_a_digest(text: str) -> None:
    assume(not is_digest(text))
    with pytest.raises(ValueError, match="64 hex characters"):
        parse_digest(text)
