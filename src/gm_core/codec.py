"""Strict JSON codec for the wire records: bytes in the bucket <-> frozen values.

Theory of operation
-------------------
Everything a node reads from the bucket may have been written by a peer running other
code, by an operator, or by nobody sane, so :func:`decode` is a total function over
bytes: it returns a valid record or raises :class:`CodecError` naming the offending
field (``path``, e.g. ``participants[2].weight``, or ``$`` for the whole document)
and a short ``reason``. No other exception escapes it, whatever the bytes.

Decoding runs in stages, each refusing what the next could misread:

1. *Size*: more than :data:`MAX_RECORD_BYTES` is refused before parsing.
2. *Text*: strict UTF-8, then Python's JSON parser with hooks that turn what JSON
   does not have (``NaN``, ``Infinity``), numbers that overflow (``1e999``, integers
   of more than 64 bits) and repeated keys into markers; those markers are refused
   by the field that receives them, so the error names that field. Nesting deeper
   than the parser's recursion limit is refused as a whole.
3. *Version*: the ``format`` field is checked before anything else, so a record from
   a newer writer reports "unknown format version" instead of its new fields.
4. *Structure*: a cattrs converter whose hooks are all strict: exact JSON kinds (no
   string for an int, no bool for a number, no number for a string; an integer is
   accepted where a float is expected), arrays only for tuples, enum values only by
   their exact string, and every field present (defaults are never filled in: a
   writer always writes every field; the one exception is a field added after
   format 1, :data:`ADDED_FIELDS`, which records written before it lack) with no
   field unknown. cattrs reports errors as
   exception groups with notes; they are flattened into the first failing field in
   declaration order, so the reported path is deterministic.
5. *Meaning*: ranges and cross-field rules that types cannot say (non-negative
   counts, ids that are safe key segments, payload references that are payload keys,
   a round record's fragment inside its frontier, a manifest's plan covering its
   schema).

:func:`encode` writes canonical JSON (sorted keys, compact separators, UTF-8, floats
as floats) and refuses to write what :func:`decode` would refuse: it decodes its own
output and requires the value it gets back to equal the input. A record that cannot
be read back is the writer's bug, caught at the writer.
"""

from __future__ import annotations

import enum
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from gm_core import keys
from gm_core.records import (
    AUTH_ALG,
    CLAIM_LIMIT_2,
    FORMAT_VERSION,
    FORMATS,
    ROSTER_ROLES,
    AlgorithmConfig,
    AuthInfo,
    Certificate,
    Claim,
    FragmentPlan,
    FragmentState,
    FrozenTensor,
    Head,
    Lease,
    Manifest,
    Member,
    Participant,
    PayloadRef,
    Record,
    Rejection,
    Requests,
    Revocation,
    Roster,
    RoundRecord,
    Snapshot,
    TensorSpec,
    Timing,
    Unit,
)

MAX_RECORD_BYTES: Final = 4 * 1024 * 1024
"""Largest encoded record (4 MiB); records point at tensors, they never hold them."""

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
"""JSON integers must fit a signed 64-bit integer, so that every reader agrees on them."""

Value = (
    Record
    | PayloadRef
    | TensorSpec
    | FrozenTensor
    | AlgorithmConfig
    | FragmentPlan
    | FragmentState
    | Participant
    | Rejection
    | Timing
    | Requests
    | Roster
    | Member
    | Certificate
    | Revocation
)
"""Everything the codec reads and writes: the records and the values nested in them."""

T = TypeVar("T", bound=Value)

KINDS: Final[tuple[type[Value], ...]] = (
    Manifest,
    Snapshot,
    RoundRecord,
    Lease,
    Claim,
    Head,
    PayloadRef,
    TensorSpec,
    FrozenTensor,
    AlgorithmConfig,
    FragmentPlan,
    FragmentState,
    Participant,
    Rejection,
    Timing,
    Requests,
    Roster,
    Member,
    Certificate,
    Revocation,
)


class CodecError(ValueError):
    """Bytes that are not a valid record, or a record that cannot be written.

    ``path`` names the field (``config.mixing``, ``frontier[0].theta.key``) or is
    ``"$"`` for the document as a whole; ``reason`` is a short sentence.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[CodecError], tuple[str, str]]:
        # ValueError pickles only its message; rebuild from the fields instead.
        return (CodecError, (self.path, self.reason))


# --- paths and faults ----------------------------------------------------------------

Segment = str | int
Path = tuple[Segment, ...]


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _render(path: Path) -> str:
    """``participants[2].weight``; a key that is not a plain name (an unknown field
    in a hostile document) is quoted, ``$["a.b"]``, so the path stays unambiguous."""
    if not path:
        return "$"
    out: list[str] = []
    for segment in path:
        if isinstance(segment, int):
            step = f"[{segment}]"
        elif len(segment) <= 40 and _NAME.fullmatch(segment):
            step = f".{segment}" if out else segment
        else:
            shown = segment if len(segment) <= 40 else segment[:40] + "..."
            step = f"[{json.dumps(shown)}]"
        out.append(step if out or not step.startswith("[") else "$" + step)
    return "".join(out)


def _fail(path: Path, reason: str) -> NoReturn:
    raise CodecError(_render(path), reason)


class _FieldError(Exception):
    """Raised by the structuring hooks; ``path`` is relative to the hook's value."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


@attrs.frozen
class _Bad:
    """What the JSON parser returns for a value JSON or this codec does not allow.

    Returning a marker instead of raising lets the field that receives the value
    report it, so the error carries that field's path.
    """

    text: str
    reason: str


def _short(value: object) -> str:
    text = value.text if isinstance(value, _Bad) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _wrong(value: object, expected: str) -> NoReturn:
    if isinstance(value, _Bad):
        raise _FieldError((), value.reason)
    raise _FieldError((), f"expected {expected}, got {_kind(value)}")


def _locate(exc: BaseException) -> tuple[Path, str]:
    """Flatten a structuring failure into (path, reason) of its first failing field.

    cattrs collects one error per failing field, in declaration order, into exception
    groups whose members carry notes naming the attribute or index; taking the first
    member at each level makes the choice deterministic.
    """
    if isinstance(exc, _FieldError):
        return exc.path, exc.reason
    if isinstance(exc, BaseValidationError):
        for sub in exc.exceptions:
            prefix: Path = ()
            for note in getattr(sub, "__notes__", ()):
                if isinstance(note, AttributeValidationNote):
                    prefix = (note.name,)
                    break
                if isinstance(note, IterableValidationNote):
                    prefix = (note.index,)
                    break
            path, reason = _locate(sub)
            return (*prefix, *path), reason
        return (), "invalid value"
    if isinstance(exc, ForbiddenExtraKeysError) and exc.extra_fields:
        return (min(exc.extra_fields),), "unknown field"
    return (), f"invalid value ({type(exc).__name__})"


# --- JSON parsing --------------------------------------------------------------------

_INT_CHARS: Final = len(str(INT_MIN))


def _parse_constant(text: str) -> _Bad:
    return _Bad(text, "NaN and Infinity are not JSON numbers")


def _parse_float(text: str) -> float | _Bad:
    value = float(text)
    return value if math.isfinite(value) else _Bad(text, "number out of range")


def _parse_int(text: str) -> int | _Bad:
    # Longer literals cannot fit 64 bits; refusing them unparsed also keeps clear of
    # the quadratic cost (and ValueError) of converting thousands of digits.
    if len(text) > _INT_CHARS:
        return _Bad(text, "integer out of the 64-bit range")
    return int(text)


def _parse_object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Bad:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                return _Bad("{...}", f"object repeats the key {_short(key)}")
            seen.add(key)
    return obj


def _loads(text: str) -> Any:
    try:
        return json.loads(
            text,
            parse_constant=_parse_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
            object_pairs_hook=_parse_object,
        )
    except RecursionError:
        raise CodecError("$", "JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise CodecError("$", f"not valid JSON: {e.msg} at offset {e.pos}") from None
    except ValueError as e:  # pragma: no cover - the hooks leave json nothing else to raise
        raise CodecError("$", f"not valid JSON: {e}") from None


def _dumps(doc: Any) -> str:
    # allow_nan=True on purpose: a NaN written here is refused by the decoder, which
    # names its field, instead of by json.dumps, which cannot.
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- strict structuring hooks --------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _structure_int(value: Any, _: type) -> int:
    if type(value) is not int:
        _wrong(value, "an integer")
    if not INT_MIN <= value <= INT_MAX:
        raise _FieldError((), "integer out of the 64-bit range")
    return value


def _structure_float(value: Any, _: type) -> float:
    if type(value) is float:
        if not math.isfinite(value):  # pragma: no cover - the parser never yields these
            raise _FieldError((), "number is not finite")
        return value
    if type(value) is int:
        return float(_structure_int(value, int))
    _wrong(value, "a number")


def _structure_str(value: Any, _: type) -> str:
    if type(value) is not str:
        _wrong(value, "a string")
    if _SURROGATE.search(value):
        raise _FieldError((), "string holds a lone surrogate, which UTF-8 cannot encode")
    return value


def _structure_bool(value: Any, _: type) -> bool:
    if type(value) is not bool:
        _wrong(value, "a boolean")
    return value


def _is_enum(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, enum.Enum)


def _structure_enum(value: Any, t: type[enum.Enum]) -> enum.Enum:
    if type(value) is not str:
        _wrong(value, "a string")
    try:
        return t(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in t)
        raise _FieldError((), f"{_short(value)} is not one of {allowed}") from None


def _structure_scalar(value: Any, t: type) -> Any:
    """The one hook for scalars and enums, chosen by the target type ``t``.

    One function for all of them because cattrs resolves classes by subclass first
    (functools.singledispatch): a ``StrEnum`` would otherwise get the ``str`` hook and
    accept any string, and ``bool`` the ``int`` hook.
    """
    if _is_enum(t):
        return _structure_enum(value, t)
    if t is bool:
        return _structure_bool(value, t)
    if t is int:
        return _structure_int(value, t)
    if t is float:
        return _structure_float(value, t)
    if t is str:
        return _structure_str(value, t)
    raise TypeError(f"no strict scalar hook for {t!r}")  # pragma: no cover - audited below


def _is_homogeneous_tuple(t: Any) -> bool:
    args = typing.get_args(t)
    return typing.get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_hook(t: Any) -> Callable[[Any, type], tuple[Any, ...]]:
    element = typing.get_args(t)[0]
    structure_element = _converter.get_structure_hook(element)

    def structure(value: Any, _: type) -> tuple[Any, ...]:
        # Only an array: cattrs would otherwise accept any iterable, so "abc" would
        # become ("a", "b", "c") and an object its tuple of keys.
        if type(value) is not list:
            _wrong(value, "an array")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(structure_element(item, element))
            except Exception as e:
                path, reason = _locate(e)
                raise _FieldError((index, *path), reason) from None
        return tuple(out)

    return structure


def _optional_inner(t: Any) -> Any:
    """``X`` for ``X | None`` (either spelling), else ``None``."""
    if typing.get_origin(t) not in (typing.Union, types.UnionType):
        return None
    args = typing.get_args(t)
    if len(args) != 2 or type(None) not in args:
        return None
    return args[0] if args[1] is type(None) else args[1]


def _is_optional(t: Any) -> bool:
    return _optional_inner(t) is not None


def _optional_hook(t: Any) -> Callable[[Any, type], Any]:
    inner = _optional_inner(t)
    structure_inner = _converter.get_structure_hook(inner)

    def structure(value: Any, _: type) -> Any:
        return None if value is None else structure_inner(value, inner)

    return structure


ADDED_FIELDS: Mapping[type, Mapping[str, Any]] = {
    AlgorithmConfig: {
        "unit": Unit.SAMPLES.value,
        "max_share": None,
        "trim_fraction": 0.25,
        "clip_norm_factor": None,
        "outlier_norm_factor": None,
        "outlier_cosine": None,
        "grace_seconds": None,
        "carry_above": 0.6,
        "overwrite_below": 0.4,
        "follow": 0,
    },
    Manifest: {"auth": None, "chained": False, "roster": None},
    RoundRecord: {"live": [], "prev": None},
}
"""Fields added after format 1, with the JSON value a record written before them means.

Only these may be absent (older writers never wrote them); every other field is required."""


def _class_hook(cl: type[Any]) -> Callable[[Any, type], Any]:
    structure_fields = make_dict_structure_fn(cl, _converter)
    names = tuple(field.name for field in attrs.fields(cl))
    known = frozenset(names)
    added = ADDED_FIELDS.get(cl, {})

    def structure(value: Any, _: type) -> Any:
        if type(value) is not dict:
            _wrong(value, "an object")
        # Missing before unknown, both before types: every field is required (the
        # record's defaults serve Python callers, never a reader) except those added
        # later, and the first problem in declaration order is the one reported.
        if added.keys() - value.keys():
            value = {**added, **value}
        for name in names:
            if name not in value:
                raise _FieldError((name,), "missing field")
        unknown = value.keys() - known
        if unknown:
            raise _FieldError((min(unknown),), "unknown field")
        try:
            return structure_fields(value, cl)
        except Exception as e:
            path, reason = _locate(e)
            raise _FieldError(path, reason) from None

    return structure


_converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
for _scalar in (int, float, str, bool, enum.Enum):
    _converter.register_structure_hook(_scalar, _structure_scalar)
_converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook)
_converter.register_structure_hook_factory(_is_optional, _optional_hook)
_converter.register_structure_hook_factory(attrs.has, _class_hook)


def _unstructure_hook(cl: type[Any]) -> Callable[[Any], Any]:
    """Leave out each field added after format 1 while it holds what its absence means: an
    object that uses no newer feature is then, byte for byte, what older readers know, so
    versions can be mixed in a run during an upgrade (they refuse only what they cannot
    read, by name: ``unknown field``)."""
    unstructure_fields = make_dict_unstructure_fn(cl, _converter)
    added = ADDED_FIELDS[cl]

    def unstructure(value: Any) -> Any:
        doc = unstructure_fields(value)
        for name, absent in added.items():
            if name in doc and _dumps(doc[name]) == _dumps(absent):
                del doc[name]
        return doc

    return unstructure


_converter.register_unstructure_hook_factory(lambda t: t in ADDED_FIELDS, _unstructure_hook)


def _supported(t: Any) -> bool:
    """Whether every hook ``t`` needs is one of the strict ones above."""
    if t in (int, float, str, bool) or _is_enum(t):
        return _converter.get_structure_hook(t) is _structure_scalar
    if _is_homogeneous_tuple(t):
        return _supported(typing.get_args(t)[0])
    if _is_optional(t):
        return _supported(_optional_inner(t))
    if isinstance(t, type) and attrs.has(t):
        attrs.resolve_types(t)
        return all(_supported(field.type) for field in attrs.fields(t))
    return False


# A field type the strict hooks do not cover would fall through to cattrs' lenient
# defaults; refuse to import rather than decode it loosely.
for _kind_type in KINDS:
    if not _supported(_kind_type):  # pragma: no cover - records.py is audited by import
        raise TypeError(f"codec has no strict hook for a field of {_kind_type.__name__}")


# --- semantic validation -------------------------------------------------------------


def _at_least(path: Path, value: float, low: float) -> None:
    if value < low:
        _fail(path, f"must be at least {low}, got {value}")


def _non_negative(path: Path, value: float) -> None:
    _at_least(path, value, 0)


MAX_GRACE_SECONDS: Final = 86_400.0
"""A fixed grace window longer than a day is a typo, not a choice: refused."""


def _below_float(path: Path, value: float, limit: float) -> None:
    if not 0.0 <= value <= limit:
        _fail(path, f"must be in [0, {limit:g}], got {value}")


def _below(path: Path, value: int, limit: int) -> None:
    if not 0 <= value < limit:
        _fail(path, f"must be in [0, {limit}), got {value}")


def _round(path: Path, value: int) -> None:
    # Every round must have a key, and keys hold 12 digits.
    _below(path, value, keys.ROUND_LIMIT)


def _id(path: Path, value: str) -> None:
    if not keys.valid_id(value):
        _fail(path, f"{_short(value)} is not a valid id")


def _non_empty(path: Path, value: str) -> None:
    if not value:
        _fail(path, "must not be empty")


def _check_payload_ref(path: Path, ref: PayloadRef) -> None:
    try:
        parsed = keys.parse(ref.key)
    except keys.BadKey as e:
        _fail((*path, "key"), e.reason)
    if not isinstance(parsed, keys.PayloadKey):
        _fail((*path, "key"), f"{_short(ref.key)} is not a payload key")
    _non_negative((*path, "size"), ref.size)
    if not keys.valid_digest(ref.digest):
        _fail((*path, "digest"), "must be 64 lowercase hex digits")


def _check_tensor_spec(path: Path, spec: TensorSpec) -> None:
    _non_empty((*path, "name"), spec.name)
    for index, size in enumerate(spec.shape):
        _non_negative((*path, "shape", index), size)
    _non_empty((*path, "dtype"), spec.dtype)


def _check_frozen_tensor(path: Path, frozen: FrozenTensor) -> None:
    _non_empty((*path, "name"), frozen.name)
    for index, size in enumerate(frozen.shape):
        _non_negative((*path, "shape", index), size)
    if not keys.valid_digest(frozen.digest):
        _fail((*path, "digest"), "must be 64 lowercase hex digits")


def _check_config(path: Path, config: AlgorithmConfig) -> None:
    if config.max_share is not None:
        _at_least((*path, "max_share"), config.max_share, 1.0)
    if not 0.0 <= config.trim_fraction < 0.5:
        _fail((*path, "trim_fraction"), f"must be in [0, 0.5), got {config.trim_fraction}")
    for name in ("clip_norm_factor", "outlier_norm_factor"):
        factor = getattr(config, name)
        if factor is not None:
            _at_least((*path, name), factor, 1.0)
    if config.outlier_cosine is not None and not -1.0 <= config.outlier_cosine <= 1.0:
        _fail((*path, "outlier_cosine"), f"must be in [-1, 1], got {config.outlier_cosine}")
    for name in ("carry_above", "overwrite_below"):  # each named where it is out of range
        threshold = getattr(config, name)
        if not -1.0 <= threshold <= 1.0:
            _fail((*path, name), f"must be in [-1, 1], got {threshold}")
    if config.overwrite_below > config.carry_above:
        _fail(
            (*path, "carry_above"),
            "must satisfy overwrite_below <= carry_above,"
            f" got {config.overwrite_below} and {config.carry_above}",
        )
    _non_negative((*path, "follow"), config.follow)
    _at_least((*path, "sync_every"), config.sync_every, 1)
    _at_least((*path, "fragments"), config.fragments, 1)
    _at_least((*path, "quorum"), config.quorum, 1)
    _at_least((*path, "in_flight"), config.in_flight, 1)
    if config.overlap_steps is not None:
        _non_negative((*path, "overlap_steps"), config.overlap_steps)
    if not 0.0 <= config.mixing <= 1.0:
        _fail((*path, "mixing"), f"must be in [0, 1], got {config.mixing}")
    _non_negative((*path, "grace_gamma"), config.grace_gamma)
    if config.grace_seconds is not None:
        _below_float((*path, "grace_seconds"), config.grace_seconds, MAX_GRACE_SECONDS)
    _non_negative((*path, "lease_timeout_s"), config.lease_timeout_s)
    _non_negative((*path, "takeover_floor_s"), config.takeover_floor_s)
    if config.global_batch_size is not None:
        _non_negative((*path, "global_batch_size"), config.global_batch_size)


def _check_fragment_plan(path: Path, plan: FragmentPlan) -> None:
    del path, plan  # tensor names are checked against the schema by the manifest


def _check_fragment_state(path: Path, state: FragmentState) -> None:
    _non_negative((*path, "version"), state.version)
    _check_payload_ref((*path, "theta"), state.theta)
    if state.momentum is not None:
        _check_payload_ref((*path, "momentum"), state.momentum)


_Item = TypeVar("_Item", TensorSpec, Member)


def _each_once(
    path: Path,
    items: tuple[_Item, ...],
    check: Callable[[Path, _Item], None],
    field: str,
    what: str,
) -> set[str]:
    """Check every item of ``items`` and that no two share ``field``; the values of it."""
    seen: set[str] = set()
    for index, item in enumerate(items):
        check((*path, index), item)
        name = getattr(item, field)
        if name in seen:
            _fail((*path, index, field), f"{what} {_short(name)} appears twice")
        seen.add(name)
    return seen


def _check_manifest(path: Path, m: Manifest) -> None:
    _id((*path, "run_id"), m.run_id)
    _id((*path, "created_by"), m.created_by)
    _check_config((*path, "config"), m.config)
    names = _each_once((*path, "schema"), m.schema, _check_tensor_spec, "name", "tensor")
    fragments = m.config.fragments
    if len(m.plan.fragments) != fragments:
        _fail(
            (*path, "plan", "fragments"),
            f"has {len(m.plan.fragments)} fragments, config.fragments is {fragments}",
        )
    planned: set[str] = set()
    for i, fragment in enumerate(m.plan.fragments):
        for j, name in enumerate(fragment):
            where = (*path, "plan", "fragments", i, j)
            if name not in names:
                _fail(where, f"tensor {_short(name)} is not in the schema")
            if name in planned:
                _fail(where, f"tensor {_short(name)} is in more than one fragment")
            planned.add(name)
    for index, spec in enumerate(m.schema):
        if spec.name not in planned:
            _fail((*path, "schema", index, "name"), "tensor is in no fragment")
    if len(m.init) != fragments:
        _fail((*path, "init"), f"has {len(m.init)} fragments, config.fragments is {fragments}")
    for index, state in enumerate(m.init):
        _check_fragment_state((*path, "init", index), state)
    for index, frozen in enumerate(m.frozen):
        where = (*path, "frozen", index)
        _check_frozen_tensor(where, frozen)
        if frozen.name in names:
            _fail((*where, "name"), f"tensor {_short(frozen.name)} is both synced and frozen")
        names.add(frozen.name)
    if m.auth is not None:
        _check_auth((*path, "auth"), m.auth)
    if m.roster is not None:
        if m.auth is None:
            _fail((*path, "roster"), "per-node keys need a run key (the run is open)")
        _check_roster((*path, "roster"), m.roster)


_KEY_ID_RE = re.compile(r"[0-9a-f]{16}")


def _check_auth(path: Path, info: AuthInfo) -> None:
    if info.alg != AUTH_ALG:
        known = f"this reader knows {AUTH_ALG}"
        _fail((*path, "alg"), f"unknown algorithm {_short(info.alg)} ({known})")
    if _KEY_ID_RE.fullmatch(info.key_id) is None:
        _fail((*path, "key_id"), "not 16 lowercase hex characters")


_PUBLIC_KEY_RE = re.compile(r"[0-9a-f]{64}")
_SIGNATURE_RE = re.compile(r"[0-9a-f]{128}")


def _check_member(path: Path, m: Member) -> None:
    _id((*path, "node"), m.node)
    if not m.roles:
        _fail((*path, "roles"), "must name at least one role")
    for index, role in enumerate(m.roles):
        if role not in ROSTER_ROLES or role in m.roles[:index]:
            _fail((*path, "roles", index), f"{_short(role)} is not a role (or appears twice)")
    if _PUBLIC_KEY_RE.fullmatch(m.public_key) is None:
        _fail((*path, "public_key"), "not 64 lowercase hex characters")


def _check_roster(path: Path, r: Roster) -> None:
    if _PUBLIC_KEY_RE.fullmatch(r.authority) is None:
        _fail((*path, "authority"), "not 64 lowercase hex characters")
    if _SIGNATURE_RE.fullmatch(r.signature) is None:
        _fail((*path, "signature"), "not 128 lowercase hex characters")
    if not r.members:
        _fail((*path, "members"), "must name at least one member")
    _each_once((*path, "members"), r.members, _check_member, "node", "node")


REASON_MAX_CHARS: Final = 200
"""The longest reason a revocation gives (it is shown, never parsed)."""


def _check_certificate(path: Path, c: Certificate) -> None:
    _check_member((*path, "member"), c.member)
    if _SIGNATURE_RE.fullmatch(c.signature) is None:
        _fail((*path, "signature"), "not 128 lowercase hex characters")


def _check_revocation(path: Path, r: Revocation) -> None:
    _id((*path, "node"), r.node)
    _round((*path, "from_round"), r.from_round)
    if len(r.reason) > REASON_MAX_CHARS or not r.reason.isprintable():
        _fail((*path, "reason"), f"not printable text of at most {REASON_MAX_CHARS} characters")
    if _SIGNATURE_RE.fullmatch(r.signature) is None:
        _fail((*path, "signature"), "not 128 lowercase hex characters")


def _check_snapshot(path: Path, s: Snapshot) -> None:
    _id((*path, "learner"), s.learner)
    _round((*path, "round"), s.round)
    _non_negative((*path, "fragment"), s.fragment)
    _non_negative((*path, "base_version"), s.base_version)
    _non_negative((*path, "steps"), s.steps)
    _non_negative((*path, "tokens"), s.tokens)
    _non_negative((*path, "step_s"), s.step_s)
    _check_payload_ref((*path, "payload"), s.payload)
    _check_requests((*path, "requests"), s.requests)


def _check_participant(path: Path, p: Participant) -> None:
    _id((*path, "learner"), p.learner)
    _non_negative((*path, "steps"), p.steps)
    _non_negative((*path, "tokens"), p.tokens)
    _non_negative((*path, "weight"), p.weight)
    _non_negative((*path, "base_version"), p.base_version)


def _check_rejection(path: Path, r: Rejection) -> None:
    _id((*path, "learner"), r.learner)


def _check_timing(path: Path, t: Timing) -> None:
    for name, value in (("step_s", t.step_s), ("quorum_s", t.quorum_s), ("sync_s", t.sync_s)):
        if value is not None:
            _non_negative((*path, name), value)


def _check_requests(path: Path, r: Requests) -> None:
    for name in ("lists", "gets", "puts", "deletes"):
        _non_negative((*path, name), getattr(r, name))


def _check_round_record(path: Path, r: RoundRecord) -> None:
    _round((*path, "round"), r.round)
    _non_negative((*path, "step"), r.step)
    _non_negative((*path, "fragment"), r.fragment)
    _non_negative((*path, "version"), r.version)
    for index, participant in enumerate(r.participants):
        _check_participant((*path, "participants", index), participant)
    for index, rejection in enumerate(r.rejections):
        _check_rejection((*path, "rejections", index), rejection)
    if r.prev is not None and not keys.valid_digest(r.prev):
        _fail(
            (*path, "prev"), f"{_short(r.prev)} is not {keys.DIGEST_HEX_CHARS} lowercase hex digits"
        )
    for index, learner in enumerate(r.live):
        _id((*path, "live", index), learner)
    if list(r.live) != sorted(set(r.live)):
        _fail((*path, "live"), "must list distinct ids in byte order")
    _check_timing((*path, "timing"), r.timing)
    _non_negative((*path, "quorum_s"), r.quorum_s)
    _non_negative((*path, "grace_s"), r.grace_s)
    _check_payload_ref((*path, "theta"), r.theta)
    if r.outer is not None:
        _check_payload_ref((*path, "outer"), r.outer)
    if r.update is not None:
        _check_payload_ref((*path, "update"), r.update)
    _id((*path, "closer"), r.closer)
    _below((*path, "claim"), r.claim, CLAIM_LIMIT_2)
    _id((*path, "next_closer"), r.next_closer)
    _round((*path, "swept_below"), r.swept_below)
    _check_requests((*path, "requests"), r.requests)
    for index, state in enumerate(r.frontier):
        _check_fragment_state((*path, "frontier", index), state)
    # The record cannot know P, but its own fragment must be in its own frontier,
    # at the version the record says it committed.
    if not r.frontier:
        _fail((*path, "frontier"), "must not be empty")
    if r.fragment >= len(r.frontier):
        _fail(
            (*path, "fragment"),
            f"fragment {r.fragment} is outside a frontier of {len(r.frontier)}",
        )
    committed = r.frontier[r.fragment].version
    if committed != r.version:
        _fail(
            (*path, "version"),
            f"version {r.version} differs from frontier[{r.fragment}].version {committed}",
        )


def _check_lease(path: Path, lease: Lease) -> None:
    _id((*path, "node"), lease.node)
    _non_negative((*path, "seq"), lease.seq)
    _non_negative((*path, "renew_s"), lease.renew_s)


def _check_claim(path: Path, c: Claim) -> None:
    _round((*path, "round"), c.round)
    _below((*path, "attempt"), c.attempt, CLAIM_LIMIT_2)
    _id((*path, "node"), c.node)


def _check_head(path: Path, h: Head) -> None:
    _round((*path, "round"), h.round)


def _validate(value: Value) -> None:
    match value:
        case Manifest():
            _check_manifest((), value)
        case Snapshot():
            _check_snapshot((), value)
        case RoundRecord():
            _check_round_record((), value)
        case Lease():
            _check_lease((), value)
        case Claim():
            _check_claim((), value)
        case Head():
            _check_head((), value)
        case PayloadRef():
            _check_payload_ref((), value)
        case TensorSpec():
            _check_tensor_spec((), value)
        case FrozenTensor():
            _check_frozen_tensor((), value)
        case AlgorithmConfig():
            _check_config((), value)
        case FragmentPlan():
            _check_fragment_plan((), value)
        case FragmentState():
            _check_fragment_state((), value)
        case Participant():
            _check_participant((), value)
        case Rejection():
            _check_rejection((), value)
        case Timing():
            _check_timing((), value)
        case Requests():
            _check_requests((), value)
        case Roster():
            _check_roster((), value)
        case Member():
            _check_member((), value)
        case Certificate():
            _check_certificate((), value)
        case Revocation():
            _check_revocation((), value)
        case _:
            typing.assert_never(value)


# --- the API -------------------------------------------------------------------------


def _require_kind(kind: type[Any]) -> None:
    if kind not in KINDS:
        raise TypeError(f"the codec does not know {kind!r}")


def _format_1_bounds(value: Value) -> None:
    """What a format-1 body may not hold that a format-2 one may: a claim attempt of
    :data:`~gm_core.keys.ATTEMPT_LIMIT` or more (format 1 numbers claims in four digits, and
    a format-1 reader refuses a record citing a higher one, so its runs never write one)."""
    match value:
        case RoundRecord():
            _below(("claim",), value.claim, keys.ATTEMPT_LIMIT)
        case Claim():
            _below(("attempt",), value.attempt, keys.ATTEMPT_LIMIT)
        case _:
            pass


_ANY_FORMAT = 0
"""For :func:`_decode_text`: no format's own bounds (a value in memory, not on the wire)."""


def _decode_text(kind: type[T], text: str, wire: int | None = None) -> T:
    """``text`` decoded as a ``kind``; ``wire``: the format whose bounds apply (None: the
    format the document declares)."""
    doc = _loads(text)
    if isinstance(doc, _Bad):
        _fail((), doc.reason)
    if type(doc) is not dict:
        _fail((), f"expected a JSON object, got {_kind(doc)}")
    if "format" in attrs.fields_dict(kind):
        if "format" not in doc:
            _fail(("format",), "missing field")
        version = doc["format"]
        if type(version) is not int or version not in FORMATS:
            known = " and ".join(map(str, FORMATS))
            _fail(
                ("format",), f"unknown format version {_short(version)} (this reader knows {known})"
            )
        if wire is None:
            wire = version
        if kind is not Manifest:  # the wire number is the run's: the envelope judges it
            doc["format"] = FORMAT_VERSION
    try:
        value: T = _converter.structure(doc, kind)
    except Exception as e:
        path, reason = _locate(e)
        _fail(path, reason)
    _validate(value)
    if wire == FORMAT_VERSION:
        _format_1_bounds(value)
    return value


def decode(kind: type[T], data: bytes | bytearray | memoryview) -> T:
    """Read a ``kind`` from ``data``, or raise :class:`CodecError`; never anything else.

    ``kind`` is a record class or one of the values nested in records. ``data`` may be
    any object with the buffer protocol (a store client's own bytes type included). A
    caller that passes another kind or a non-buffer gets ``TypeError``: that is misuse,
    not bad data.
    """
    _require_kind(kind)
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"decode needs bytes, got {type(data).__name__}") from None
    if view.nbytes > MAX_RECORD_BYTES:
        _fail((), f"document is {view.nbytes} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    try:
        text = view.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        _fail((), f"not valid UTF-8 at byte {e.start}")
    return _decode_text(kind, text)


def small_object(body: bytes, max_bytes: int, fields: frozenset[str]) -> dict[str, Any] | None:
    """The JSON object in ``body`` when it is at most ``max_bytes`` long and has exactly
    ``fields``; None for anything else (total: no input raises). For the small markers of
    the coordination modules, whose field values each reader then checks itself."""
    if len(body) > max_bytes:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return doc if isinstance(doc, dict) and set(doc) == fields else None


def declared_format(data: bytes) -> int | None:
    """The ``format`` a document declares, nothing else checked (None: it declares none).

    For telling a newer writer's record, which a reader must not skip, from garbage.
    """
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        doc = _loads(data.decode("utf-8"))
    except (CodecError, UnicodeDecodeError):
        return None
    version = doc.get("format") if type(doc) is dict else None
    return version if type(version) is int else None


_FORMAT_FIELD = re.compile(rb'"format"\s*:\s*(\d{1,4})\b')


def format_number(body: bytes) -> int | None:
    """The format number a record's body declares, found without parsing it (None: none).

    For judging an object's format on every read at the cost of a scan, not a second
    parse: ``"format":`` with unescaped quotes is a key (a quote inside a JSON string is
    escaped), no record nests a field of that name and a repeated key is refused, so for
    every body :func:`decode` accepts this is its ``format``. For any other it is still a
    function of the bytes alone, so every reader finds the same.
    """
    found = _FORMAT_FIELD.search(body, 0, MAX_RECORD_BYTES)
    return None if found is None else int(found.group(1))


def encode(record: Value, version: int | None = None) -> bytes:
    """Canonical JSON of ``record``: sorted keys, no spaces, UTF-8, floats as floats.

    ``version``: the wire format to declare (the run's, :data:`~gm_core.records.FORMATS`)
    in a record other than a manifest, whose ``format`` is the run's own; None: as the
    value holds it. In memory every record but the manifest holds ``format`` 1 (its field
    set), so that a value and its digest are the same whichever format carried it.

    Raises :class:`CodecError` for a record :func:`decode` would refuse (a negative
    count, a NaN, a hostile id, a value of the wrong type), naming the field.
    """
    kind = type(record)
    _require_kind(kind)
    try:
        text = _dumps(_converter.unstructure(record))
    except (TypeError, ValueError) as e:
        _fail((), f"not serializable as JSON: {e}")
    # The bounds of the format declared on the wire; with none named, of none: in memory a
    # record of either format holds format 1's number, and its digest must be computable.
    back = _decode_text(kind, text, _ANY_FORMAT if version is None else version)
    if back != record:
        _fail((), "the record changes in a round trip (a field holds a value of the wrong type)")
    # Re-render the decoded value: it holds floats as floats, so equal records written
    # with 1 or 1.0 in a float field give the same bytes.
    doc = _converter.unstructure(back)
    if version is not None and kind is not Manifest and "format" in doc:
        if version not in FORMATS:
            raise ValueError(f"format {version} is not one this code writes ({FORMATS})")
        doc["format"] = version
    out = _dumps(doc).encode("utf-8")
    if len(out) > MAX_RECORD_BYTES:
        _fail((), f"record is {len(out)} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    return out
