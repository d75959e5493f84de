"""The chained tape (spec/protocol.md §16.5, issue 12 item 2): each record names its
predecessor's digest, and a node that holds a record adopts the next only if it names it.

In an open run nothing authenticates a record, so a codec-valid, plausible record for
the next round — another run's, an old copy put back, a forger's that copies a real
record's shape — used to be adopted by every node. In a chained run one that does not
name the record the nodes hold is invalid at its slot: the round's closer writes at
the slot above, every node adopts that one, and the run goes on. A run created before
the chain (its manifest not ``chained``) writes and reads records as before.
"""

from __future__ import annotations

import itertools
import json
import random

import attrs
from fast_cluster import FAST_C, FAST_L, C, L, drive, random_step
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, codec, keys, tape
from gm_core import cluster as cl
from gm_core.check import forger
from gm_core.records import AlgorithmConfig, Manifest

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1)
OPEN = auth.for_run("run", None)


def started(chained: bool = True) -> cl.Cluster:
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    if not chained:
        c = attrs.evolve(c, manifest=attrs.evolve(c.manifest, chained=False))
    for name in sorted(ROLES):
        c = cl.start(c, name)
    return c


def committing(c: cl.Cluster, rng: random.Random, records: int = 1) -> cl.Cluster:
    while len(cl.records(c)) < records:
        c = random_step(c, rng, sorted(ROLES))
    return c


def test_every_record_names_its_predecessor() -> None:
    c = drive(started(), 200, random.Random(1))  # checks every invariant after each tick
    records = cl.records(c)
    assert len(records) >= 4
    assert records[0].prev == tape.chain_digest(c.manifest)
    for before, after in itertools.pairwise(records):
        assert after.prev == tape.chain_digest(before)


def test_a_record_that_does_not_chain_is_skipped_and_the_run_goes_on() -> None:
    """A plausible forged record at the next round's slot 0 of an open run (the forger copies
    the newest record's shape, so it names the newest record's predecessor): every node that
    holds the newest record names it invalid, the closer writes at slot 1, nothing forged is
    merged, and the run keeps committing."""
    rng = random.Random(7)
    c = committing(started(), rng)
    target = cl.records(c)[-1].round + 1
    forged = forger.forged_record(c)
    assert forged is not None
    key, body = forged
    c = cl.inject(c, key, body)
    c = drive(c, 300, rng)
    records = cl.records(c)
    assert records[-1].round > target + 2
    assert all(p.learner != forger.EVIL for r in records for p in r.participants)
    winner = {r.round: r for r in records}[target]
    assert winner.closer != forger.EVIL
    assert tape.record_key(OPEN, target, 1) in c.store.objects
    skipped = [n.detail for _, n in c.notes if n.kind == "record_rejected" and n.round == target]
    assert skipped
    assert all("does not chain" in d for d in skipped)


def test_the_same_forgery_is_adopted_in_a_run_without_the_chain() -> None:
    """The contrast, and what a run created before the chain still does (an open run makes no
    promise against outsiders, §16.5.2): the plausible forgery is the round's record."""
    rng = random.Random(7)
    c = committing(started(chained=False), rng)
    target = cl.records(c)[-1].round + 1
    forged = forger.forged_record(c)
    assert forged is not None
    c = cl.inject(c, *forged)
    for _ in range(300):
        c = random_step(c, rng, sorted(ROLES))
    # The nodes adopted the forgery as the round's record and went on after it: the run's
    # own closers wrote none for that round (its tape, less what outsiders wrote, has a gap).
    rounds = [r.round for r in cl.records(c)]
    assert target not in rounds
    assert max(rounds) > target
    assert any(v.invariant == "contiguous_tape" for v in cl.check(c))


def test_runs_without_the_chain_write_records_as_before() -> None:
    c = drive(started(chained=False), 120, random.Random(2))
    records = cl.records(c)
    assert records
    assert all(r.prev is None and b'"prev"' not in codec.encode(r) for r in records)
    assert b'"chained"' not in codec.encode(c.manifest)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_expected_prev_names_the_held_record_or_nothing(seed: int) -> None:
    """What a node checks: the manifest's digest for round 0, the held record's for the
    round after it, and nothing when it holds no predecessor (a joiner) or the run is not
    chained."""
    c = committing(started(), random.Random(seed), records=2)
    first, second = cl.records(c)[:2]
    manifest: Manifest = c.manifest
    assert tape.expected_prev(manifest, None, 0) == tape.chain_digest(manifest)
    assert tape.expected_prev(manifest, first, 1) == second.prev
    assert tape.expected_prev(manifest, first, 2) is None
    assert tape.expected_prev(manifest, None, 1) is None
    unchained = attrs.evolve(manifest, chained=False)
    assert tape.expected_prev(unchained, first, 1) is None
    # The digest is of the canonical encoding: key order or spacing in the stored bytes
    # does not change it.
    spaced = json.dumps(json.loads(codec.encode(first)), indent=2, sort_keys=False)
    assert tape.chain_digest(codec.decode(type(first), spaced.encode())) == second.prev
    assert keys.valid_digest(second.prev or "")


def test_an_authenticated_record_that_does_not_chain_is_a_fork_and_stops_the_run() -> None:
    """§16.5.3: only a key holder can write an authenticated record, so one that does not
    name the record the nodes hold means two tapes (an overwrite, a member's misbehaviour).
    Nodes report ``fork`` and stop at that round — nobody writes the slot above (which would
    make the fork real for readers of the other side) — where in an open run the same
    record is skipped (the test above)."""
    run_key = bytes(range(32))
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C, run_key=run_key)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    rng = random.Random(7)
    c = committing(c, rng)
    target = cl.records(c)[-1].round + 1
    forged = forger.forged_record(c)
    assert forged is not None
    key, body = forged
    envelope = auth.for_run(c.manifest.run_id, auth.derive(run_key))
    c = cl.inject(c, key, envelope.seal(key, body))  # a key holder's record: it opens
    for _ in range(400):
        c = random_step(c, rng, sorted(ROLES))
    assert cl.records(c)[-1].round == target - 1
    assert c.store.get(tape.record_key(envelope, target, 1)) is None
    forks = [n for _, n in c.notes if n.kind == "fork"]
    assert forks
    assert all(n.round == target and "fork: it names" in n.detail for n in forks)
    assert not [n for _, n in c.notes if n.kind == "record_rejected" and n.round == target]


def test_an_authentic_record_of_a_newer_envelope_stops_the_probe() -> None:
    """Spec §16.7: skipping a newer gm's record would split the tape between versions, so
    an older node stops there (``newer``); a forged one (bad tag) is skipped as garbage."""
    config = AlgorithmConfig(sync_every=2, fragments=1)
    envelope = auth.for_run("run", auth.derive(bytes(32)))
    key = tape.record_key(envelope, 3, 0)
    header = envelope.seal(key, b"{}").split(b"\n", 1)[0].split(b" ")
    data = b" ".join([b"gm/3", *header[1:4]]) + b"\n{}"
    parsed = tape.parse_record(envelope, data, 3, config)
    assert isinstance(parsed, tape.BadRecord)
    assert parsed.newer
    assert tape.after(tape.SlotCursor(), parsed) is None
    forged = data.replace(header[3], b"0" * 64)
    parsed = tape.parse_record(envelope, forged, 3, config)
    assert isinstance(parsed, tape.BadRecord)
    assert not parsed.stops
