"""Properties of the bucket layout: builders and parser are exact inverses, order is
numeric order, and nothing but a builder's output parses."""

from __future__ import annotations

import pickle
import string

import pytest
from hypothesis import assume, find, given
from hypothesis import strategies as st

from gm_core import keys, slots
from gm_core.keys import (
    BadKey,
    BarrierArrivalKey,
    BarrierMarkerKey,
    ClaimKey,
    DoneKey,
    FinishedKey,
    FollowKey,
    HeadKey,
    LeaseKey,
    ManifestKey,
    ParsedKey,
    PayloadKey,
    QueueClaimKey,
    QueueDoneKey,
    QueueUnitsKey,
    ResumeKey,
    RoundKey,
    SnapshotKey,
)

ID_ALPHABET = string.ascii_letters + string.digits + "._-"


def reference_valid_id(s: str) -> bool:
    """valid_id restated without a regex, as the oracle for it."""
    return (
        1 <= len(s) <= 64
        and all(c in ID_ALPHABET for c in s)
        and s[0] in string.ascii_letters + string.digits
        and ".." not in s
    )


rounds = st.integers(0, keys.ROUND_LIMIT - 1)
attempts = st.integers(0, keys.ATTEMPT_LIMIT - 1)
ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True).filter(
    lambda s: ".." not in s
)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
slot_names = st.none() | st.text("0123456789abcdef", min_size=16, max_size=16)

parsed_keys: st.SearchStrategy[ParsedKey] = st.one_of(
    st.builds(ManifestKey, st.integers(0, keys.MANIFEST_SLOTS - 1)),
    st.just(HeadKey()),
    st.builds(RoundKey, rounds, slot_names),
    st.builds(SnapshotKey, rounds, ids, slot_names),
    st.builds(PayloadKey, rounds, digests),
    st.builds(LeaseKey, ids),
    st.builds(ClaimKey, rounds, attempts),
    st.builds(ClaimKey, rounds, st.none(), slot_names.filter(lambda n: n is not None)),
    st.builds(ResumeKey, ids),
    st.builds(BarrierArrivalKey, ids, rounds, ids, slot_names),
    st.builds(BarrierMarkerKey, ids, rounds, slot_names),
    st.builds(QueueUnitsKey, ids),
    st.builds(QueueClaimKey, ids, ids, attempts),
    st.builds(QueueDoneKey, ids, ids, attempts),
    st.builds(DoneKey, ids),
    st.just(FinishedKey()),
    st.builds(FollowKey, rounds),
)

# Pieces that look like parts of keys, so that fuzzing reaches deep into the parser.
TOKENS = [
    "manifest.json",
    "head.json",
    "rounds",
    "snapshots",
    "payloads",
    "leases",
    "claims",
    "nodes",
    "resume.bin",
    "barriers",
    "parties",
    "released.json",
    "queue",
    "units",
    "units.json",
    "done",
    "finished.json",
    "/",
    "//",
    ".json",
    ".st",
    ".",
    "..",
    "-",
    "_",
    "0",
    "1",
    "0001",
    "000000000001",
    "999999999999",
    "0000000000001",
    "٠",
    "¹",
    "\n",
    " ",
    "a",
    "Z",
    "a" * 64,
    "f" * 64,
    "F" * 64,
    "\x00",
]
token_strings = st.lists(st.sampled_from(TOKENS), max_size=8).map("".join)


@st.composite
def mutated_keys(draw: st.DrawFn) -> str:
    key = keys.build(draw(parsed_keys))
    chars = list(key)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(chars)))
        char = draw(st.sampled_from(sorted(set("/.0123456789afAF-_\n٣ ") | {"\u212a"})))
        if op == "insert":
            chars.insert(at, char)
        elif chars and at < len(chars):
            if op == "delete":
                del chars[at]
            else:
                chars[at] = char
    return "".join(chars)


# --- valid_id ------------------------------------------------------------------------


@given(st.text(max_size=80))
def test_valid_id_matches_reference_on_any_text(s: str) -> None:
    assert keys.valid_id(s) == reference_valid_id(s)


@given(st.text(ID_ALPHABET + "/\\ \n\u212a٣", max_size=70))
def test_valid_id_matches_reference_on_near_misses(s: str) -> None:
    assert keys.valid_id(s) == reference_valid_id(s)


@given(ids)
def test_generated_ids_are_valid(s: str) -> None:
    assert keys.valid_id(s)


@pytest.mark.parametrize(
    "s",
    ["", ".", "..", ".hidden", "-rf", "_x", "a/b", "a\\b", "a..b", "a" * 65, "a\n", "é", "\u212a"],
)
def test_hostile_ids_are_invalid(s: str) -> None:
    assert not keys.valid_id(s)


@pytest.mark.parametrize("s", ["a", "A", "0", "node-1", "learner_2.gpu", "a.b", "a" * 64, "a."])
def test_plain_ids_are_valid(s: str) -> None:
    assert keys.valid_id(s)


# --- builders ------------------------------------------------------------------------


def test_layout_is_the_documented_one() -> None:
    d = "0123456789abcdef" * 4
    assert keys.manifest() == "manifest.json"
    assert keys.head() == "head.json"
    assert keys.round_record(7) == "rounds/000000000007.json"
    assert keys.snapshot(7, "l-1") == "snapshots/000000000007/l-1.json"
    named = keys.snapshot(7, "l-1", "0123456789abcdef")
    assert named == "snapshots/000000000007/l-1/0123456789abcdef.json"
    assert keys.snapshot_prefix(7) == "snapshots/000000000007/"
    assert keys.payload(7, d) == f"payloads/000000000007/{d}.st"
    assert keys.payload_prefix(7) == "payloads/000000000007/"
    assert keys.lease("n1") == "leases/n1.json"
    assert keys.LEASES_PREFIX == "leases/"
    assert keys.claim(7, 3) == "claims/000000000007/0003.json"
    named_claim = keys.named_claim(7, "0123456789abcdef")
    assert named_claim == "claims/000000000007/0123456789abcdef.json"
    assert keys.parse(named_claim) == ClaimKey(7, None, "0123456789abcdef")
    assert keys.claim_prefix(7) == "claims/000000000007/"
    assert keys.ROUNDS_PREFIX == "rounds/"
    assert keys.barrier_prefix("b") == "barriers/b/"
    assert keys.barrier_generation_prefix("b", 7) == "barriers/b/000000000007/"
    assert keys.barrier_arrival("b", 7, "n1") == "barriers/b/000000000007/parties/n1.json"
    assert keys.barrier_marker("b", 7) == "barriers/b/000000000007/released.json"
    assert keys.queue_units("q") == "queue/q/units.json"
    assert keys.queue_unit_prefix("q", "u1") == "queue/q/units/u1/"
    assert keys.queue_claim("q", "u1", 3) == "queue/q/units/u1/claims/0003.json"
    assert keys.queue_done("q", "u1", 3) == "queue/q/units/u1/done/0003.json"
    assert keys.done("n1") == "done/n1.json"
    assert keys.finished() == "finished.json"


@given(ids, rounds, rounds, ids)
def test_barrier_generations_sort_numerically_and_hold_their_own_keys(
    name: str, a: int, b: int, party: str
) -> None:
    assume(a < b)
    assert keys.barrier_generation_prefix(name, a) < keys.barrier_generation_prefix(name, b)
    for key in (keys.barrier_arrival(name, a, party), keys.barrier_marker(name, a)):
        assert key.startswith(keys.barrier_generation_prefix(name, a))
        assert not key.startswith(keys.barrier_generation_prefix(name, b))
        assert key.startswith(keys.barrier_prefix(name))


@given(rounds, ids, digests, attempts)
def test_keys_live_under_their_prefixes(r: int, name: str, digest: str, attempt: int) -> None:
    assert keys.round_record(r).startswith(keys.ROUNDS_PREFIX)
    assert keys.snapshot(r, name).startswith(keys.snapshot_prefix(r))
    assert keys.payload(r, digest).startswith(keys.payload_prefix(r))
    assert keys.lease(name).startswith(keys.LEASES_PREFIX)
    assert keys.claim(r, attempt).startswith(keys.claim_prefix(r))
    for prefix in (keys.snapshot_prefix(r), keys.payload_prefix(r), keys.claim_prefix(r)):
        assert prefix.endswith("/")


@given(rounds, rounds, ids)
def test_prefixes_do_not_capture_other_rounds(a: int, b: int, name: str) -> None:
    assume(a != b)
    assert not keys.snapshot(b, name).startswith(keys.snapshot_prefix(a))
    assert not keys.claim(b, 0).startswith(keys.claim_prefix(a))
    assert not keys.round_record(b).startswith(keys.round_prefix(a))
    assert not keys.round_record(b, "0" * 16).startswith(keys.round_prefix(a))


@given(rounds, slot_names)
def test_every_slot_of_a_round_is_under_its_round_prefix(r: int, name: str | None) -> None:
    assert keys.round_record(r, name).startswith(keys.round_prefix(r))


@given(rounds, rounds, slot_names, slot_names)
def test_round_keys_sort_numerically(a: int, b: int, x: str | None, y: str | None) -> None:
    assume(a < b)
    assert keys.round_record(a, x) < keys.round_record(b, y)
    assert keys.snapshot_prefix(a) < keys.snapshot_prefix(b)
    assert keys.payload_prefix(a) < keys.payload_prefix(b)
    assert keys.claim_prefix(a) < keys.claim_prefix(b)


@given(rounds, attempts, rounds, attempts)
def test_claim_keys_sort_by_round_then_attempt(r1: int, a1: int, r2: int, a2: int) -> None:
    assume((r1, a1) < (r2, a2))
    assert keys.claim(r1, a1) < keys.claim(r2, a2)


@given(rounds, ids, ids)
def test_snapshot_keys_sort_by_round_first(r: int, x: str, y: str) -> None:
    assume(r + 1 < keys.ROUND_LIMIT)
    assert keys.snapshot(r, x) < keys.snapshot(r + 1, y)


@pytest.mark.parametrize("r", [-1, keys.ROUND_LIMIT, 10**20])
def test_round_out_of_range_is_misuse(r: int) -> None:
    for build in (keys.round_record, keys.snapshot_prefix, keys.payload_prefix, keys.claim_prefix):
        with pytest.raises(ValueError, match="round"):
            build(r)


@pytest.mark.parametrize("attempt", [-1, keys.ATTEMPT_LIMIT])
def test_attempt_out_of_range_is_misuse(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        keys.claim(0, attempt)


def test_non_int_round_is_misuse() -> None:
    with pytest.raises(TypeError):
        keys.round_record(True)
    with pytest.raises(TypeError):
        keys.round_record(1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", "-x", "a" * 65])
def test_builders_refuse_invalid_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid id"):
        keys.snapshot(0, bad)
    with pytest.raises(ValueError, match="not a valid id"):
        keys.lease(bad)
    with pytest.raises(ValueError, match="not a valid id"):
        keys.resume(bad)


@given(ids)
def test_a_resume_key_sits_in_its_nodes_own_folder_outside_every_swept_one(node: str) -> None:
    key = keys.resume(node)
    assert key == f"nodes/{node}/resume.bin"
    swept = (keys.SNAPSHOTS_PREFIX, keys.PAYLOADS_PREFIX, keys.CLAIMS_PREFIX, keys.LEASES_PREFIX)
    assert not key.startswith(swept)


@pytest.mark.parametrize("bad", ["", "A" * 64, "a" * 63, "a" * 65, "g" * 64, "a" * 63 + "\n"])
def test_payload_refuses_invalid_digests(bad: str) -> None:
    with pytest.raises(ValueError, match="digest"):
        keys.payload(0, bad)


# --- parse ---------------------------------------------------------------------------


@given(parsed_keys)
def test_parse_inverts_build(parsed: ParsedKey) -> None:
    assert keys.parse(keys.build(parsed)) == parsed


@given(rounds, ids, digests, attempts)
def test_parse_inverts_each_builder(r: int, name: str, digest: str, attempt: int) -> None:
    assert keys.parse(keys.manifest()) == ManifestKey()
    assert keys.parse(keys.manifest(15)) == ManifestKey(slot=15) == keys.parse("manifest.15.json")
    assert keys.parse(keys.head()) == HeadKey()
    assert keys.parse(keys.round_record(r)) == RoundKey(r)
    assert keys.parse(keys.snapshot(r, name)) == SnapshotKey(r, name)
    assert keys.parse(keys.payload(r, digest)) == PayloadKey(r, digest)
    assert keys.parse(keys.lease(name)) == LeaseKey(name)
    assert keys.parse(keys.claim(r, attempt)) == ClaimKey(r, attempt)
    assert keys.parse(keys.resume(name)) == ResumeKey(name)


def _parses_exactly_or_refuses(key: str) -> bool:
    """True when ``key`` parsed (and rebuilds to itself); False when refused."""
    error: BadKey | None = None
    try:
        parsed = keys.parse(key)
    except BadKey as e:
        error = e
    if error is not None:
        assert error.key == key
        assert error.reason
        return False
    assert keys.build(parsed) == key
    return True


@given(st.text(max_size=120))
def test_any_text_parses_exactly_or_is_refused(key: str) -> None:
    _parses_exactly_or_refuses(key)


@given(token_strings)
def test_key_like_text_parses_exactly_or_is_refused(key: str) -> None:
    _parses_exactly_or_refuses(key)


@given(mutated_keys())
def test_mutated_keys_parse_exactly_or_are_refused(key: str) -> None:
    _parses_exactly_or_refuses(key)


def test_mutations_reach_both_outcomes() -> None:
    # Guards the fuzz test above against vacuity: its inputs must include keys that
    # still parse after mutation and keys that do not.
    find(mutated_keys(), _parses_exactly_or_refuses)
    find(mutated_keys(), lambda key: not _parses_exactly_or_refuses(key))


D = "ab" * 32
HOSTILE_KEYS = [
    "",
    "/",
    "manifest.json/",
    "/manifest.json",
    "manifest.00.json",
    "manifest.16.json",
    "manifest.1.json",
    "manifest.001.json",
    "manifest.٠١.json",
    "manifest.01.json/",
    "Manifest.json",
    "manifest.json\n",
    " head.json",
    "heads.json",
    "rounds/1.json",
    "rounds/0000000000001.json",
    "rounds/00000000000a.json",
    "rounds/-00000000001.json",
    "rounds/+00000000001.json",
    "rounds/٠٠٠٠٠٠٠٠٠٠٠١.json",
    "rounds/00000000000¹.json",
    "rounds/000000000001.json/",
    "rounds//000000000001.json",
    "rounds/000000000001.JSON",
    "rounds/000000000001.json.bak",
    "rounds/000000000001",
    "rounds/",
    "round/000000000001.json",
    "snapshots/000000000001/../x.json",
    "snapshots/000000000001/..json",
    "snapshots/000000000001/.json",
    "snapshots/000000000001/a/b.json",
    "snapshots/000000000001/a..b.json",
    "snapshots/000000000001/-a.json",
    "snapshots/000000000001/",
    "snapshots/000000000001",
    "snapshots/000000000001/é.json",
    f"snapshots/000000000001/{'a' * 65}.json",
    f"payloads/000000000001/{D.upper()}.st",
    f"payloads/000000000001/{D[:-1]}.st",
    f"payloads/000000000001/{D}a.st",
    f"payloads/000000000001/{D}.json",
    f"payloads/000000000001/{D}",
    f"payloads/1/{D}.st",
    "leases/.json",
    "leases/a/b.json",
    "leases/..json",
    "leases/a.json/",
    "claims/000000000001/01.json",
    "claims/000000000001/00001.json",
    "claims/000000000001/000a.json",
    "claims/000000000001.json",
    "claims/000000000001/0001/x.json",
    "nodes/a/resume.json",
    "nodes/a/resume.bin/",
    "nodes/../resume.bin",
    "nodes/.a/resume.bin",
    "nodes/a/b/resume.bin",
    "nodes/resume.bin",
    "nodes/a/Resume.bin",
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_keys_are_refused(key: str) -> None:
    with pytest.raises(BadKey) as info:
        keys.parse(key)
    assert info.value.key == key
    assert repr(key) in str(info.value)


def test_parse_of_non_str_is_misuse() -> None:
    with pytest.raises(TypeError):
        keys.parse(b"head.json")  # type: ignore[arg-type]


def test_bad_key_is_a_value_error_and_pickles() -> None:
    with pytest.raises(BadKey) as info:
        keys.parse("nope")
    assert isinstance(info.value, ValueError)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.key, again.reason) == (info.value.key, info.value.reason)


@given(rounds, digests)
def test_round_of_payload_key(r: int, digest: str) -> None:
    assert keys.round_of_payload_key(keys.payload(r, digest)) == r


@given(rounds, ids)
def test_round_of_payload_key_refuses_other_keys(r: int, name: str) -> None:
    for key in (keys.round_record(r), keys.snapshot(r, name), keys.manifest()):
        with pytest.raises(BadKey, match="not a payload key"):
            keys.round_of_payload_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "rounds/000000000001.0123456789abcde.json",  # 15 hex
        "rounds/000000000001.0123456789ABCDEF.json",  # upper case
        "rounds/000000000001..json",
        "rounds/000000000001.0123456789abcdef.0123456789abcdef.json",
        "rounds/000000000001.0123456789abcdeg.json",
    ],
)
def test_malformed_slot_names_are_bad_keys(key: str) -> None:
    with pytest.raises(keys.BadKey):
        keys.parse(key)


def test_the_manifest_has_as_many_slots_as_every_create_once_key() -> None:
    assert keys.MANIFEST_SLOTS == slots.SLOTS
    with pytest.raises(ValueError, match="slot"):
        keys.manifest(keys.MANIFEST_SLOTS)
