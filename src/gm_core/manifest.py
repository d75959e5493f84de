"""Adopting a run: is the manifest in the bucket the run this node would have created?

Theory of operation
-------------------
The first node of a run writes the manifest create-once; every later node
computes the manifest it *would* have written (its config, its model's schema,
the plan both imply) and compares it with the one it found. Nodes that differ
in anything the run agrees on — the wire format of the records, any field of the
algorithm config, the tensor schema, or the fragment plan — cannot train
together: their deltas would be merged with the wrong weights, layouts or
formats. :func:`manifest_mismatch` names every such difference in one sentence
so the operator sees at once what to change, and returns ``None`` when the node
may adopt the run.

What is *not* compared, by design: ``run_id`` and ``created_by`` (who won the
creation race is not a property of the run's training) and ``init`` (the
initial parameters are the creator's; a joining node loads them, whatever its
own were).

Two rules make nodes of different precisions one run. The schema is the *wire*
schema (:func:`wire_schema`: every synced tensor as ``F32``, the host buffers
every payload decodes to), so a bf16, an fp16 and an fp32 learner of one model
have one schema. And a node that leaves the wire formats to the run gets
:func:`natural_format` of its parameters when it creates the run (a bf16 model
ships bf16, 2 bytes per value, not 4) and the run's formats when it joins;
:func:`wire_wider_than_params` names the cost when a run's format is wider than a
learner's parameters.

Frozen parameters (a LoRA run's base model) are not in the schema: the manifest
pins each by the digest of its values, and :func:`frozen_mismatch` names every
frozen tensor a joining node holds differently — a different base would make its
adapter deltas meaningless.

Pinning (spec/protocol.md §16.5.2, trust on first use). Comparing config and schema
cannot tell a forged manifest from the real one: a bucket writer who creates the
manifest at a new prefix before its creator, with the run's config and schema and its
own ``init``, is adopted by every node, creator included. :func:`digest` names one
manifest exactly (SHA-256 of its canonical encoding, the value a chained run's round 0
names as ``prev``); a node told the digest (``manifest_digest=``, printed when the run
is created and by ``gm status``) refuses any other manifest (:func:`pin_mismatch`)
before it trains or aligns anything.
"""

from __future__ import annotations

import enum

import attrs

from gm_core.records import FORMATS, AlgorithmConfig, FrozenTensor, Manifest, TensorSpec, WireFormat
from gm_core.tape import chain_digest

DIGEST_CHARS = 64
"""A manifest digest is 64 lowercase hex characters (SHA-256)."""
_HEX = frozenset("0123456789abcdef")

MAX_LISTED = 5
"""Differences of one kind named individually before the rest are only counted."""


def manifest_mismatch(mine: Manifest, theirs: Manifest) -> str | None:
    """Why this node (``mine``) cannot join the run described by ``theirs``; None if it can."""
    problems = [
        *_format_mismatch(mine.format, theirs.format),
        *config_mismatch(mine.config, theirs.config),
        *schema_mismatch(mine.schema, theirs.schema),
        *frozen_mismatch(mine.frozen, theirs.frozen),
    ]
    if not problems and mine.plan != theirs.plan:
        # Same config and schema imply the same plan; a different one was made by other code.
        problems.append("the fragment plan differs (the run was created by another gm version)")
    if not problems:
        return None
    return "this node cannot join the run: " + "; ".join(problems)


def _format_mismatch(mine: int, theirs: int) -> list[str]:
    """A node joins a run of any wire format it reads, and writes it (its envelope takes
    the run's, gm_core.auth.of_run): the mode, not the number, is the node's choice."""
    if mine == theirs or theirs in FORMATS:
        return []
    return [f"manifest format: the run has {theirs}, this node writes {mine}"]


def config_mismatch(mine: AlgorithmConfig, theirs: AlgorithmConfig) -> list[str]:
    """One phrase per config field that differs, in declaration order."""
    return [
        f"config.{field.name}: the run has {_shown(getattr(theirs, field.name))}, "
        f"this node has {_shown(getattr(mine, field.name))}"
        for field in attrs.fields(AlgorithmConfig)
        if getattr(mine, field.name) != getattr(theirs, field.name)
    ]


def _shown(value: object) -> str:
    """A config value as the user wrote it: an enum by its value (``'carry'``, not its repr)."""
    return repr(value.value if isinstance(value, enum.Enum) else value)


def schema_mismatch(mine: tuple[TensorSpec, ...], theirs: tuple[TensorSpec, ...]) -> list[str]:
    """Tensors missing on either side, tensors whose shape or dtype differ, or another order."""
    if mine == theirs:
        return []
    ours = {t.name: t for t in mine}
    run = {t.name: t for t in theirs}
    problems = [
        *_listed("tensors this node lacks", [n for n in run if n not in ours]),
        *_listed("tensors the run lacks", [n for n in ours if n not in run]),
        *_listed(
            "tensors that differ",
            [_spec_difference(ours[n], run[n]) for n in run if n in ours and ours[n] != run[n]],
        ),
    ]
    if not problems:
        problems.append("the schema lists the same tensors in another order")
    return problems + _prefix_hint([t.name for t in mine], [t.name for t in theirs])


def _prefix_hint(mine: list[str], theirs: list[str]) -> list[str]:
    """When every name differs by one common prefix only, say so and how to fix it."""
    if not mine or len(mine) != len(theirs) or mine == theirs:
        return []
    for longer, shorter, whose in ((mine, theirs, "this node's"), (theirs, mine, "the run's")):
        first_long, first_short = longer[0], shorter[0]
        if len(first_long) <= len(first_short) or not first_long.endswith(first_short):
            continue
        prefix = first_long[: len(first_long) - len(first_short)]
        if all(a == prefix + b for a, b in zip(longer, shorter, strict=True)):
            return [
                f"only a prefix differs: {whose} tensor names all start with {prefix!r}; "
                "train the same module on every node (unwrap a wrapper, e.g. model.module "
                "or a peft model's base) or wrap it the same way everywhere"
            ]
    return []


def _spec_difference(mine: TensorSpec, theirs: TensorSpec) -> str:
    return (
        f"{mine.name!r} is {theirs.dtype}{list(theirs.shape)} in the run, "
        f"{mine.dtype}{list(mine.shape)} here"
    )


def _listed(what: str, items: list[str]) -> list[str]:
    if not items:
        return []
    named = ", ".join(items[:MAX_LISTED])
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return [f"{what}: {named}{more}"]


WIRE_DTYPE = "F32"
"""The dtype of every tensor of a run's schema: payloads decode to fp32 host buffers."""


def wire_schema(held: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """The run's schema for parameters ``held`` in whatever dtypes: names, shapes, F32."""
    return tuple(attrs.evolve(t, dtype=WIRE_DTYPE) for t in held)


_NARROW = {"BF16": WireFormat.BF16, "F16": WireFormat.F16}
_WIDTH_BYTES = {WireFormat.F32: 4, WireFormat.F16: 2, WireFormat.BF16: 2}


def natural_format(held: tuple[TensorSpec, ...]) -> WireFormat:
    """The wire format that carries ``held`` parameters without widening them.

    BF16 when every parameter is bf16, F16 when every one is fp16, F32 otherwise:
    a run created by a bf16 model ships bf16 unless its config says otherwise.
    """
    dtypes = {t.dtype for t in held}
    if len(dtypes) == 1:
        return _NARROW.get(next(iter(dtypes)), WireFormat.F32)
    return WireFormat.F32


def wire_wider_than_params(config: AlgorithmConfig, held: tuple[TensorSpec, ...]) -> str | None:
    """A warning when the run ships more bytes per value than :func:`natural_format` needs."""
    natural = natural_format(held)
    wide = [
        f"{role}_format={fmt.value}"
        for role, fmt in (("delta", config.delta_format), ("commit", config.commit_format))
        if _WIDTH_BYTES.get(fmt, 0) > _WIDTH_BYTES[natural]
    ]
    if not wide:
        return None
    dtypes = "/".join(sorted({t.dtype for t in held}))
    return (
        f"the run ships {' and '.join(wide)}, wider than this learner's {dtypes} parameters "
        f"({_WIDTH_BYTES[natural]} bytes per value): every payload costs more than the values "
        f"it carries; a run created with {natural.value} formats (or by this model, with the "
        "formats left unset) ships fewer bytes"
    )


def frozen_mismatch(mine: tuple[FrozenTensor, ...], theirs: tuple[FrozenTensor, ...]) -> list[str]:
    """Frozen tensors missing on either side, or held with other shapes or values."""
    if mine == theirs:
        return []
    ours = {t.name: t for t in mine}
    run = {t.name: t for t in theirs}
    return [
        *_listed("frozen tensors this node lacks", [n for n in run if n not in ours]),
        *_listed("frozen tensors the run lacks", [n for n in ours if n not in run]),
        *_listed(
            "frozen tensors that differ from the run's base (shape or values)",
            [n for n in run if n in ours and ours[n] != run[n]],
        ),
    ]


def digest(manifest: Manifest) -> str:
    """The digest that names ``manifest`` exactly: what a node pins (``manifest_digest=``)
    and what a chained run's record of round 0 names as ``prev``."""
    return chain_digest(manifest)


def parse_digest(text: str) -> str:
    """A manifest digest as a person copied it (case and surrounding spaces ignored);
    raises ValueError naming what a digest looks like."""
    cleaned = text.strip().lower()
    if len(cleaned) != DIGEST_CHARS or not set(cleaned) <= _HEX:
        raise ValueError(
            f"a manifest digest is {DIGEST_CHARS} hex characters (the run's creator and "
            f"`gm status` print it); got {len(cleaned)} characters"
        )
    return cleaned


def pin_mismatch(pinned: str, manifest: Manifest) -> str | None:
    """Why a node that pinned ``pinned`` (:func:`parse_digest`'s) refuses ``manifest``
    (None: it is the pinned one)."""
    found = digest(manifest)
    if found == pinned:
        return None
    return (
        f"the manifest here has digest {found}, this node pinned {pinned}: it is not the "
        f"run this node was told to join (another run at this prefix, or a forged or "
        f"replaced manifest); nothing was trained or loaded"
    )
