"""No decodable input makes a machine raise (issue 12, item 4; DESIGN §7).

A forger with write access to the bucket drops codec-valid objects with extreme
values — rounds at the key space's end, claim attempts at its limit, int64
counters, huge timings, ids that never joined — at the keys a running cluster
is about to read, at a random moment of a random run. Both machines on every
node must keep going: whatever they make of the object (a rejection, a stalled
round), ``advance`` returns, and every record a closer writes is one every
reader accepts. Safety under forgery is not claimed here: without a
run key a forger can write a valid-looking commit; that is the authentication
part of the issue.
"""

from __future__ import annotations

import random

import attrs
from fast_cluster import FAST_C, FAST_L, C, L, random_step
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, codec, keys, tape
from gm_core import cluster as cl
from gm_core.records import (
    AlgorithmConfig,
    Claim,
    Head,
    Lease,
    Participant,
    Reason,
    Rejection,
    RoundRecord,
    Snapshot,
    Timing,
)

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1, in_flight=2)
INT_MAX = codec.INT_MAX
LAST_ROUND = keys.ROUND_LIMIT - 1
LAST_ATTEMPT = keys.ATTEMPT_LIMIT - 1

big_int = st.sampled_from([0, 1, 2, 2**31, 2**53 + 1, INT_MAX])
big_float = st.sampled_from([0.0, 1e-300, 1.0, 1e7, 1e300])
some_id = st.sampled_from(["n0", "n1", "n2", "evil", "x" * 64])

OPEN = auth.for_manifest(None)
"""An open run's envelope (it seals and opens bodies bare, whatever the run id)."""


def step(c: cl.Cluster, rng: random.Random) -> cl.Cluster:
    return random_step(c, rng, sorted(ROLES))


@st.composite
def forged_record(draw: st.DrawFn, genuine: RoundRecord, round_: int) -> RoundRecord:
    version = draw(big_int)
    frontier = tuple(
        attrs.evolve(fs, version=version if f == genuine.fragment else draw(big_int))
        for f, fs in enumerate(genuine.frontier)
    )
    return attrs.evolve(
        genuine,
        round=round_,
        step=draw(big_int),
        version=version,
        claim=draw(st.sampled_from([0, 1, LAST_ATTEMPT])),
        next_closer=draw(some_id),
        closer=draw(some_id),
        swept_below=draw(st.sampled_from([0, round_, LAST_ROUND])),
        quorum_s=draw(big_float),
        grace_s=draw(big_float),
        timing=Timing(step_s=draw(big_float), quorum_s=draw(big_float), sync_s=draw(big_float)),
        frontier=frontier,
        participants=tuple(
            Participant(
                learner=draw(some_id),
                steps=draw(big_int),
                tokens=draw(big_int),
                weight=1.0,
                base_version=draw(big_int),
                final=False,
            )
            for _ in range(draw(st.integers(0, 2)))
        ),
        rejections=tuple(
            Rejection(learner=draw(some_id), reason=draw(st.sampled_from(list(Reason))))
            for _ in range(draw(st.integers(0, 2)))
        ),
    )


@st.composite
def forgeries(draw: st.DrawFn, c: cl.Cluster) -> list[tuple[str, bytes]]:
    """Objects a forger writes at the keys this cluster reads next."""
    tape = cl.records(c)
    newest = tape[-1].round if tape else -1
    round_ = draw(st.sampled_from([newest + 1, newest + 2, newest + 1000, LAST_ROUND]))
    objects: list[tuple[str, bytes]] = []
    kinds = draw(
        st.sets(
            st.sampled_from(["record", "head", "claim", "lease", "snapshot", "junk"]), min_size=1
        )
    )
    if "record" in kinds and tape:
        objects.append(
            (keys.round_record(round_), codec.encode(draw(forged_record(tape[-1], round_))))
        )
    if "head" in kinds:
        objects.append(
            (keys.head(), codec.encode(Head(round=draw(st.sampled_from([round_, LAST_ROUND])))))
        )
    if "claim" in kinds:
        attempt = draw(st.sampled_from([0, 1, LAST_ATTEMPT]))
        claim = Claim(node=draw(some_id), round=newest + 1, attempt=attempt)
        objects.append((keys.claim(newest + 1, attempt), codec.encode(claim)))
    if "lease" in kinds:
        lease = Lease(
            node="evil", roles=("learner", "closer"), seq=draw(big_int), renew_s=draw(big_float)
        )
        objects.append((keys.lease("evil"), codec.encode(lease)))
    if "snapshot" in kinds and tape:
        victim = draw(some_id)
        genuine = tape[-1].theta
        snapshot = Snapshot(
            learner=victim,
            round=newest + 1,
            fragment=draw(st.integers(0, CONFIG.fragments - 1)),
            base_version=draw(big_int),
            steps=draw(big_int),
            tokens=draw(big_int),
            step_s=draw(big_float),
            schema_digest="0" * 64,
            payload=genuine,
        )
        objects.append((keys.snapshot(newest + 1, victim), codec.encode(snapshot)))
    if "junk" in kinds:
        objects.append((keys.round_record(newest + 1), draw(st.binary(max_size=64))))
    return objects


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), before=st.integers(0, 400), data=st.data())
def test_no_forged_object_makes_a_machine_raise(
    seed: int, before: int, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    for _ in range(before):
        c = step(c, rng)
    for key, blob in data.draw(forgeries(c)):
        c = cl.inject(c, key, blob)
    for _ in range(400):
        c = step(c, rng)
    # Whatever the closers made of it, what they write, every reader can follow.
    for key, stored in c.store.objects.items():
        parsed = keys.parse(key)
        if isinstance(parsed, keys.RoundKey) and key not in c.hostile:
            record = tape.parse_record(OPEN, stored.data, parsed.round, CONFIG)
            assert not isinstance(record, tape.BadRecord), record
