"""Fragment plans: how whole tensors are dealt into the ``P`` fragments, and the schema digest.

Theory of operation
-------------------
The plan is computed once, by the node that creates the run, and written into the
create-once manifest; everyone else reads it from there. It must still be a pure,
deterministic function of the schema and config, so that tests, the simulator and
the model checker reproduce it exactly and a restarted creator writes the same
manifest.

Two partitions are offered. ``bytes`` balances the fragments' sizes with the
classic greedy "largest first onto the lightest bin" rule (its imbalance is at most
the largest tensor). ``strided`` deals transformer blocks round-robin, so each
fragment holds every P-th block — Streaming DiLoCo's layout — and then places the
remaining tensors (embeddings, final norm, head) greedily by bytes.

The schema digest is what snapshots carry so a closer can reject a delta computed
for a different model (``Reason.SCHEMA``) without opening its payload.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from typing import assert_never

from gm_core.records import AlgorithmConfig, FragmentPlan, Partition, TensorSpec

DTYPE_BYTES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
"""Bytes per element of each dtype name a model tensor may have (safetensors names).

Sub-byte formats (F4_E2M1) are wire encodings of deltas, never a model's own dtype,
so they are deliberately absent.
"""

BLOCK_PATTERN = re.compile(r"(?:^|\.)(?:layers|blocks|h|layer)\.(\d+)\.")
"""Finds the transformer block index in names like ``model.layers.3.mlp.w`` or
``transformer.h.11.attn.c_attn.weight``; the first match in a name wins."""

_DIGEST_DOMAIN = "gm.schema.v1"


def schema_digest(schema: tuple[TensorSpec, ...]) -> str:
    """64 hex chars: blake2b-256 of a canonical encoding of the schema, in order.

    The encoding is compact JSON of ``[domain, [[name, [dims...], dtype], ...]]``:
    JSON string escaping makes it unambiguous (no name can forge a separator), and
    the domain tag keeps it from colliding with any other digest gm computes.
    """
    canonical = [_DIGEST_DOMAIN, [[t.name, list(t.shape), t.dtype] for t in schema]]
    encoded = json.dumps(canonical, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(encoded.encode("ascii"), digest_size=32).hexdigest()


def tensor_bytes(spec: TensorSpec) -> int:
    """Size of the tensor in the model's own dtype: elements times bytes per element."""
    try:
        per_element = DTYPE_BYTES[spec.dtype]
    except KeyError:
        raise ValueError(f"tensor {spec.name!r}: unknown dtype {spec.dtype!r}") from None
    if any(dim < 0 for dim in spec.shape):
        raise ValueError(f"tensor {spec.name!r}: negative dimension in shape {spec.shape}")
    return math.prod(spec.shape) * per_element


def _check_schema(schema: tuple[TensorSpec, ...], fragments: int) -> list[int]:
    """Validate and return each tensor's size, so errors name the actual problem."""
    if fragments < 1:
        raise ValueError(f"fragments must be >= 1, got {fragments}")
    if len(schema) < fragments:
        raise ValueError(
            f"schema has {len(schema)} tensors, fewer than the {fragments} fragments: "
            "every fragment needs at least one whole tensor"
        )
    seen: set[str] = set()
    for spec in schema:
        if spec.name in seen:
            raise ValueError(f"duplicate tensor name {spec.name!r} in schema")
        seen.add(spec.name)
    return [tensor_bytes(spec) for spec in schema]


def _place_greedily(
    indices: Iterable[int], sizes: list[int], loads: list[int], members: list[list[int]]
) -> None:
    """Put each tensor (largest first, ties by schema order) on the lightest fragment.

    "Lightest" is fewest bytes, then fewest tensors, then lowest index. The middle
    key goes beyond plain byte balancing for one reason: zero-sized tensors. Without
    it, tensors of zero bytes would all pile onto fragment 0 and leave others empty.
    With positive sizes it only breaks ties that bytes alone leave open.
    """
    for index in sorted(indices, key=lambda i: (-sizes[i], i)):
        target = min(range(len(loads)), key=lambda f: (loads[f], len(members[f]), f))
        loads[target] += sizes[index]
        members[target].append(index)


def _to_plan(schema: tuple[TensorSpec, ...], members: list[list[int]]) -> FragmentPlan:
    # Names within a fragment follow schema order, independent of placement order.
    return FragmentPlan(
        fragments=tuple(tuple(schema[i].name for i in sorted(group)) for group in members)
    )


def plan_by_bytes(schema: tuple[TensorSpec, ...], fragments: int) -> FragmentPlan:
    """Balance fragments by bytes: largest tensor first, each onto the lightest fragment.

    Largest-first greedy keeps the heaviest and lightest fragment within one
    largest tensor of each other, which bounds the worst round's payload.
    """
    sizes = _check_schema(schema, fragments)
    loads = [0] * fragments
    members: list[list[int]] = [[] for _ in range(fragments)]
    _place_greedily(range(len(schema)), sizes, loads, members)
    return _to_plan(schema, members)


def block_index(name: str) -> int | None:
    """The transformer block a tensor belongs to, or None for embeddings, norms, heads."""
    match = BLOCK_PATTERN.search(name)
    return None if match is None else int(match.group(1))


def plan_strided(schema: tuple[TensorSpec, ...], fragments: int) -> FragmentPlan:
    """Deal transformer blocks round-robin (block ``b`` to fragment ``b mod P``).

    Tensors outside any block are then placed greedily by bytes, so the large
    embedding and head land on the fragments the blocks left lightest. A model with
    too few blocks and too few other tensors to fill every fragment cannot be
    strided; that raises ValueError rather than produce an empty fragment (a round
    that syncs nothing).
    """
    sizes = _check_schema(schema, fragments)
    loads = [0] * fragments
    members: list[list[int]] = [[] for _ in range(fragments)]
    others: list[int] = []
    for index, spec in enumerate(schema):
        block = block_index(spec.name)
        if block is None:
            others.append(index)
        else:
            target = block % fragments
            loads[target] += sizes[index]
            members[target].append(index)
    _place_greedily(others, sizes, loads, members)
    empty = [f for f, group in enumerate(members) if not group]
    if empty:
        raise ValueError(
            f"strided partition leaves fragments {empty} empty: the schema's blocks and "
            f"{len(others)} other tensors cannot fill {fragments} fragments; use fewer "
            "fragments or partition='bytes'"
        )
    return _to_plan(schema, members)


def make_plan(schema: tuple[TensorSpec, ...], config: AlgorithmConfig) -> FragmentPlan:
    """The run's plan, as its config's ``partition`` and ``fragments`` say."""
    if config.partition is Partition.BYTES:
        return plan_by_bytes(schema, config.fragments)
    if config.partition is Partition.STRIDED:
        return plan_strided(schema, config.fragments)
    assert_never(config.partition)
