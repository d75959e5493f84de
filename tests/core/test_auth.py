"""The authentication envelope (gm_core.auth): what opens, what does not, and why."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core import auth, codec
from gm_core.auth import Envelope, Unauthenticated, Why
from gm_core.records import FORMAT_2, FORMAT_VERSION, FORMATS, AuthInfo, Head

run_keys = st.binary(min_size=auth.KEY_BYTES, max_size=auth.KEY_BYTES)
object_keys = st.sampled_from(
    ["manifest.json", "head.json", "rounds/000000000007.json", "snapshots/000000000007/a.json"]
)
bodies = st.binary(max_size=300)
run_ids = st.sampled_from(["", "run", "other"])


def keyed(run_key: bytes, run_id: str = "run") -> Envelope:
    return auth.for_run(run_id, auth.derive(run_key))


@given(run_key=run_keys, run_id=run_ids, key=object_keys, body=bodies)
def test_a_sealed_object_opens_to_its_body(
    run_key: bytes, run_id: str, key: str, body: bytes
) -> None:
    envelope = keyed(run_key, run_id)
    sealed = envelope.seal(key, body)
    assert sealed.startswith(auth.MARKER)
    assert envelope.open(key, sealed) == body
    assert auth.header_key_id(sealed) == auth.derive(run_key).key_id


@given(run_key=run_keys, run_id=run_ids, key=object_keys, body=bodies)
def test_the_tag_is_the_hmac_of_the_framed_domain_run_key_and_body(
    run_key: bytes, run_id: str, key: str, body: bytes
) -> None:
    """The tag the header carries is protocol.md §16.2's, written out here from its
    definition: HMAC-SHA256 under the run's tag key over the domain, run id and object key,
    each after its length (8 bytes, big-endian), then the body — whatever the envelope
    caches between tags (a tape sealed by earlier code must still open)."""
    run_auth = auth.derive(run_key)
    parts = (auth._DOMAIN, run_id.encode(), key.encode())
    message = b"".join(len(p).to_bytes(8, "big") + p for p in parts) + body
    expected = hmac.new(run_auth.tag_key, message, hashlib.sha256).hexdigest()
    for _ in range(2):  # the second seal copies the run's cached MAC again
        sealed = auth.for_run(run_id, run_auth).seal(key, body)
        header = sealed.split(b"\n", 1)[0].decode()
        assert header.split(" ")[3] == expected


@given(run_key=run_keys, key=object_keys, body=bodies, data=st.data())
def test_any_changed_byte_is_refused(
    run_key: bytes, key: str, body: bytes, data: st.DataObject
) -> None:
    envelope = keyed(run_key)
    sealed = bytearray(envelope.seal(key, body))
    at = data.draw(st.integers(0, len(sealed) - 1))
    sealed[at] ^= data.draw(st.integers(1, 255))
    assert isinstance(envelope.open(key, bytes(sealed)), Unauthenticated)


@given(run_key=run_keys, key=object_keys, other=object_keys, body=bodies)
def test_an_object_is_authentic_only_at_its_own_key_in_its_own_run(
    run_key: bytes, key: str, other: str, body: bytes
) -> None:
    sealed = keyed(run_key, "run").seal(key, body)
    if other != key:
        assert _why(keyed(run_key, "run").open(other, sealed)) is Why.BAD_TAG
    assert _why(keyed(run_key, "other").open(key, sealed)) is Why.BAD_TAG


@given(key_a=run_keys, key_b=run_keys, key=object_keys, body=bodies)
def test_another_runs_key_is_named(key_a: bytes, key_b: bytes, key: str, body: bytes) -> None:
    sealed = keyed(key_a).seal(key, body)
    verdict = keyed(key_b).open(key, sealed)
    if auth.derive(key_a).key_id == auth.derive(key_b).key_id:
        assert verdict == body
    else:
        assert _why(verdict) is Why.WRONG_KEY


@given(run_key=run_keys, key=object_keys, data=st.binary(max_size=700))
def test_no_input_makes_open_raise(run_key: bytes, key: str, data: bytes) -> None:
    assert isinstance(keyed(run_key).open(key, data), Unauthenticated)  # no tag by chance
    opened = auth.for_run("run", None).open(key, data)
    assert opened == data if not data.startswith(auth.MARKER) else _why(opened) is Why.TAGGED


@given(run_key=run_keys, key=object_keys, body=bodies)
def test_a_forged_tag_with_the_right_key_id_is_a_bad_tag(
    run_key: bytes, key: str, body: bytes
) -> None:
    key_id = auth.derive(run_key).key_id
    forged = b"gm/2 hmac-sha256 %s %s\n%s" % (key_id.encode(), b"0" * 64, body)
    assert _why(keyed(run_key).open(key, forged)) is Why.BAD_TAG


def test_headers_that_do_not_parse_are_named() -> None:
    envelope = keyed(b"k" * 32)
    key_id = envelope.auth.key_id if envelope.auth else ""
    good = envelope.seal("head.json", b"{}")
    tag = good.split(b"\n", 1)[0].split(b" ")[3]
    cases = {
        b'{"format":1}': Why.UNTAGGED,
        b"gm/2 " + b"x" * 600: Why.MALFORMED_HEADER,  # no line end within the cap
        b"gm/2 hmac-sha256 %s\n{}" % key_id.encode(): Why.MALFORMED_HEADER,
        b"gm/2 hmac-sha256 %s %s extra\n{}" % (key_id.encode(), tag): Why.MALFORMED_HEADER,
        b"gm/2 hmac-sha256 %s %s\n{}" % (key_id.upper().encode(), tag): Why.MALFORMED_HEADER,
        b"gm/2 blake3-keyed %s %s\n{}" % (key_id.encode(), tag): Why.UNKNOWN_ALG,
        b"gm/2 hmac-sha256 %s %s\n{}" % (b"0" * 16, tag): Why.WRONG_KEY,
        "gm/2 hmac-sha256 \u00e9\n{}".encode(): Why.MALFORMED_HEADER,
    }
    for data, why in cases.items():
        assert _why(envelope.open("head.json", data)) is why, data[:40]
    assert envelope.open("head.json", good) == b"{}"


@given(
    text=st.text(alphabet="0123456789abcdefABCDEF xg-\u00e9", max_size=20),
    length=st.integers(0, 20),
)
def test_a_header_field_is_hex_only_when_every_character_is_a_lowercase_hex_digit(
    text: str, length: int
) -> None:
    expected = len(text) == length and all(c in "0123456789abcdef" for c in text)
    assert auth._is_hex(text, length) is expected


@given(body=bodies)
def test_an_open_run_stores_bodies_bare_and_refuses_tagged_objects(body: bytes) -> None:
    envelope = auth.for_run("run", None)
    assert envelope.seal("head.json", body) == body
    if not body.startswith(auth.MARKER):
        assert envelope.open("head.json", body) == body
    tagged = keyed(b"k" * 32).seal("head.json", body)
    assert _why(envelope.open("head.json", tagged)) is Why.TAGGED


def test_keys_parse_and_derive_refuse_what_is_not_a_key() -> None:
    key = bytes(range(32))
    assert auth.parse_key(f"  {key.hex()}\n") == key
    assert auth.parse_key(key.hex().upper()) == key
    for bad in ("", "00" * 31, "zz" * 32, key.hex() + "00"):
        with pytest.raises(ValueError, match="64 hex characters"):
            auth.parse_key(bad)
    for raw in (b"", b"k" * 31, b"k" * 33):
        with pytest.raises(ValueError, match="32 bytes"):
            auth.derive(raw)
    derived = auth.derive(key)
    assert key.hex() not in repr(derived)
    assert derived.key_id in repr(derived)
    assert len({derived.tag_key, derived.payload_key, key}) == 3


def test_a_node_and_a_run_must_agree_on_the_mode_and_the_key() -> None:
    mine = auth.derive(b"a" * 32)
    other = auth.derive(b"b" * 32)
    assert auth.mismatch(None, None) is None
    assert auth.mismatch(auth.info(mine), mine) is None
    assert "run is open" in (auth.mismatch(None, mine) or "")
    assert f"run key id {mine.key_id}" in (auth.mismatch(auth.info(mine), None) or "")
    problem = auth.mismatch(AuthInfo(alg=auth.ALG, key_id=other.key_id), mine) or ""
    assert mine.key_id in problem
    assert other.key_id in problem


def _why(verdict: bytes | Unauthenticated) -> Why | None:
    return verdict.why if isinstance(verdict, Unauthenticated) else None


# --- dispatch on the first bytes (spec/protocol.md §16.7) -------------------------------


def newer(envelope: Envelope, key: str, body: bytes, version: int, extra: bytes = b"") -> bytes:
    """What a newer gm would write: ``gm/N`` and the same three fields over the same tag
    input (the envelope is stable from format 2 on), then whatever it adds."""
    header = envelope.seal(key, body).split(b"\n", 1)[0]
    fields = header.split(b" ")[1:4]
    return b" ".join([b"gm/%d" % version, *fields]) + extra + b"\n" + body


@given(
    run_key=run_keys,
    key=object_keys,
    body=bodies,
    version=st.integers(3, 9999),
    extra=st.sampled_from([b"", b" more", b" a b c"]),
)
def test_an_authentic_object_of_a_newer_envelope_is_named_not_skipped_as_garbage(
    run_key: bytes, key: str, body: bytes, version: int, extra: bytes
) -> None:
    envelope = keyed(run_key)
    data = newer(envelope, key, body, version, extra)
    assert _why(envelope.open(key, data)) is Why.NEWER_FORMAT
    tag = data.split(b"\n", 1)[0].split(b" ")[3]
    forged = data.replace(tag, b"0" * 64, 1)  # the tag made up
    assert _why(envelope.open(key, forged)) is Why.BAD_TAG
    assert _why(keyed(bytes(32)).open(key, data)) in (Why.WRONG_KEY, Why.NEWER_FORMAT)
    assert _why(auth.for_run("run", None).open(key, data)) is Why.TAGGED


def test_what_is_not_a_newer_envelope_stays_what_it_was() -> None:
    envelope = keyed(b"k" * 32)
    body = b"{}"
    for version, why in ((1, Why.UNTAGGED), (0, Why.UNTAGGED), (10**5, Why.UNTAGGED)):
        data = newer(envelope, "head.json", body, version)
        assert _why(envelope.open("head.json", data)) is why, version
    assert _why(envelope.open("head.json", b"gm/03 x\n{}")) is Why.UNTAGGED
    assert _why(envelope.open("head.json", b"gm/3\n{}")) is Why.UNTAGGED  # no "gm/N " marker
    assert _why(envelope.open("head.json", b"gm/3 x y\n{}")) is Why.MALFORMED_HEADER


# --- the body's format (spec/protocol.md §16.7) -------------------------------------------

RECORD_KEYS = {
    "rounds/000000000007.json": Head(round=7),  # any record will do: the key decides the check
    "snapshots/000000000007/a.json": Head(round=7),
    "leases/a.json": Head(round=7),
    "head.json": Head(round=7),
}


@given(
    key=st.sampled_from(sorted(RECORD_KEYS)),
    writer=st.sampled_from(FORMATS),
    reader=st.sampled_from(FORMATS),
)
def test_an_authentic_record_opens_only_in_a_run_of_its_format(
    key: str, writer: int, reader: int
) -> None:
    """A body declares its run's format; a run of the other refuses it by name
    (``wrong_format``), whoever tagged it: a run has one format."""
    run_auth = auth.derive(bytes(32))
    sealed = auth.for_run("run", run_auth, writer).pack(key, RECORD_KEYS[key])
    assert codec.declared_format(sealed.split(b"\n", 1)[1]) == writer
    got = auth.for_run("run", run_auth, reader).open(key, sealed)
    if writer == reader:
        assert codec.decode(Head, got) == RECORD_KEYS[key]  # type: ignore[arg-type]
    else:
        assert isinstance(got, Unauthenticated)
        assert got.why is Why.WRONG_FORMAT
        assert f"a format {writer} object in a format {reader} run" in got.detail
    assert not isinstance(auth.for_run("run", run_auth).open(key, sealed), Unauthenticated)


def test_a_bare_object_in_a_format_2_run_is_a_format_1_object() -> None:
    run_auth = auth.derive(bytes(32))
    bare = codec.encode(Head(round=7))
    for body_format, why in ((FORMAT_2, Why.WRONG_FORMAT), (FORMAT_VERSION, Why.UNTAGGED)):
        got = auth.for_run("run", run_auth, body_format).open("head.json", bare)
        assert _why(got) is why
    got = auth.for_run("run", run_auth, FORMAT_2).open("head.json", bare)
    assert isinstance(got, Unauthenticated)
    assert "a format 1 object in a format 2 run (it carries no tag)" in got.detail
    assert _why(auth.for_run("run", run_auth, FORMAT_2).open("head.json", b"garbage")) is (
        Why.UNTAGGED
    )


def test_objects_that_are_not_records_keep_their_own_format() -> None:
    """The finished summary and the coordination markers have forms of their own."""
    envelope = auth.for_run("run", auth.derive(bytes(32)), FORMAT_2)
    for key in ("finished.json", "follow/000000000003.json", "done/a.json"):
        body = b'{"format":1,"x":1}'
        assert envelope.open(key, envelope.seal(key, body)) == body


def test_a_newer_body_format_is_left_to_the_codec() -> None:
    """A body declaring format 3 opens: the codec names it, and a record probe stops at it."""
    envelope = auth.for_run("run", auth.derive(bytes(32)), FORMAT_2)
    body = b'{"format":3,"round":7}'
    key = "rounds/000000000007.json"
    assert envelope.open(key, envelope.seal(key, body)) == body
