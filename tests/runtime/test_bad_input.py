"""Bad input dropped into a running run's bucket is rejected by name, and the run goes on.

Three honest nodes train (quorum 2). A hostile writer — this test, with nothing but
the bucket — watches the tape and, two rounds ahead of the newest commit, drops
snapshots no correct learner would write: a payload whose bytes do not match their
digest, a delta of NaNs, a snapshot computed for another model, a payload with the
wrong tensor shapes, a snapshot that is not JSON, and a key no learner could have;
and objects meant to cost a reader memory: a snapshot of 8 MiB, a reference that
declares a payload of 10 GiB, a payload whose safetensors header nests 30,000 deep.
Each must show up by name: in a round record's rejections, or as a node's event.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import blake3
import numpy as np
from runtime_bucket import Witness, judge
from runtime_harness import file_run, make_harness, wait_until
from test_chaos import committed, started

from gm_core import codec, keys, plan, schedule
from gm_core.records import Manifest, PayloadRef, Reason, RoundRecord, Snapshot, TensorSpec
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.mailbox import Mailbox
from gm_shell.stores import MailboxOptions

EXPECTED = {
    "evil-corrupt": Reason.CORRUPT,
    "evil-nan": Reason.NONFINITE,
    "evil-schema": Reason.SCHEMA,
    "evil-shape": Reason.SCHEMA,
    "evil-malformed": Reason.CORRUPT,
    "evil-huge": Reason.CORRUPT,
    "evil-declared": Reason.CORRUPT,
    "evil-nested": Reason.CORRUPT,
}


@attrs.define
class Hostile:
    """Writes bad objects for one future round at a time, with the run's own formats."""

    mailbox: Mailbox
    manifest: Manifest
    done: set[int] = attrs.field(factory=set)

    async def attack(self, newest: RoundRecord) -> None:
        target = newest.round + 2  # not open yet: the closer will list these when it opens
        if target in self.done:
            return
        self.done.add(target)
        payloads, records = await asyncio.to_thread(self.forge, newest, target)
        for key, data in payloads.items():  # payloads before pointers, like a learner
            await self.mailbox.put_once(key, data)
        for key, data in records.items():
            await self.mailbox.put_once(key, data)

    def forge(self, newest: RoundRecord, target: int) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """Bad payloads and the snapshot records that point at them (CPU work: off the loop)."""
        fragment = schedule.fragment_of(target, self.manifest.config.fragments)
        # With two fragments, round target-1 syncs the other one: the base is unchanged.
        base = newest.frontier[fragment].version
        ours = FragmentCodec(self.manifest)
        size = ours.size(fragment)
        _, zeros_ref = ours.encode(fragment, Role.DELTA, target, np.zeros(size, np.float32))
        ones, _ = ours.encode(fragment, Role.DELTA, target, np.ones(size, np.float32))
        nan, nan_ref = ours.encode(fragment, Role.DELTA, target, np.full(size, np.nan, np.float32))
        shape, shape_ref = FragmentCodec(transposed(self.manifest)).encode(
            fragment, Role.DELTA, target, np.ones(size, np.float32)
        )
        digest = plan.schema_digest(self.manifest.schema)
        nested = nested_header()
        nested_digest = blake3.blake3(nested).hexdigest()
        nested_ref = PayloadRef(
            key=keys.payload(target, nested_digest), size=len(nested), digest=nested_digest
        )
        payloads = {zeros_ref.key: ones, nan_ref.key: nan, shape_ref.key: shape}
        payloads[nested_ref.key] = nested
        snapshots = {
            "evil-corrupt": (zeros_ref, digest),  # the bytes of ones under the digest of zeros
            "evil-nan": (nan_ref, digest),
            "evil-schema": (nan_ref, "0" * 64),
            "evil-shape": (shape_ref, digest),
            "evil-declared": (attrs.evolve(zeros_ref, size=10 << 30), digest),
            "evil-nested": (nested_ref, digest),
        }
        records = {
            keys.snapshot(target, learner): codec.encode(
                Snapshot(
                    learner=learner,
                    round=target,
                    fragment=fragment,
                    base_version=base,
                    steps=8,
                    tokens=256,
                    step_s=0.01,
                    schema_digest=schema_digest,
                    payload=ref,
                )
            )
            for learner, (ref, schema_digest) in snapshots.items()
        }
        records[keys.snapshot(target, "evil-malformed")] = b"{not json"
        records[keys.snapshot(target, "evil-huge")] = b" " * (8 << 20)
        records[f"{keys.snapshot_prefix(target)}nested/evil.json"] = b"{}"
        return payloads, records


def nested_header(depth: int = 30_000) -> bytes:
    """A safetensors file whose header is an array nested ``depth`` deep."""
    header = b"[" * depth + b"]" * depth
    return len(header).to_bytes(8, "little") + header


def transposed(manifest: Manifest) -> Manifest:
    """The same tensor names and sizes, with every 2-d tensor's shape reversed."""
    schema = tuple(
        TensorSpec(name=t.name, shape=t.shape[::-1], dtype=t.dtype) for t in manifest.schema
    )
    return attrs.evolve(manifest, schema=schema)


def rejections(witness: Witness) -> set[tuple[str, Reason]]:
    found = set()
    for r in committed(witness):
        record = codec.decode(RoundRecord, witness.seen[keys.round_record(r)][0])
        found |= {(x.learner, x.reason) for x in record.rejections}
    return found


def test_bad_input_is_rejected_by_name_and_the_run_goes_on(tmp_path: Path) -> None:
    url, options = file_run(tmp_path)
    h = make_harness(url, options, tmp_path, quorum=2)
    witness = Witness(url, options)
    try:
        h.spawn("n0", seed=0)
        wait_until("the run to exist", lambda: started(h, "n0"), 60)
        witness.start()
        h.spawn("n1")
        h.spawn("n2", role="learner")
        wait_until("everyone to join", lambda: started(h, "n1") and started(h, "n2"), 60)
        asyncio.run(attack_until_all_rejected(url, options, witness))
        count = len(committed(witness))
        wait_until("the run to go on", lambda: len(committed(witness)) >= count + 6, 60)
        running = len(committed(witness))  # later rounds hold the closing nodes' final deltas
        codes = h.stop("n2", "n1", "n0")
    finally:
        h.close()
        witness.stop()
    assert all(code == 0 for code in codes.values()), codes
    judgement = judge(url, options, witness)
    assert not judgement.violations, judgement.violations
    for record in judgement.records[running - 4 : running]:
        assert {p.learner for p in record.participants} <= {"n0", "n1", "n2"}
        assert len(record.participants) >= 2
    events = {(e["event"], e.get("detail", "")) for e in h.all_events()}
    assert any(kind == "bad_key" and "nested/evil.json" in d for kind, d in events), events
    assert any(kind == "snapshot_malformed" for kind, _ in events)
    assert any(kind == "refused" and "evil-huge" in d for kind, d in events), events


async def attack_until_all_rejected(url: str, options: MailboxOptions, witness: Witness) -> None:
    with Mailbox.open(url, options=options) as mailbox:
        got = await mailbox.get(keys.manifest())
        assert got is not None
        hostile = Hostile(mailbox=mailbox, manifest=codec.decode(Manifest, got.data))
        for _ in range(600):
            seen = rejections(witness)
            if all((name, reason) in seen for name, reason in EXPECTED.items()):
                return
            rounds = committed(witness)
            if rounds:
                data = witness.seen[keys.round_record(rounds[-1])][0]
                await hostile.attack(codec.decode(RoundRecord, data))
            await asyncio.sleep(0.1)
    missing = {n: r for n, r in EXPECTED.items() if (n, r) not in rejections(witness)}
    raise AssertionError(f"not rejected by name: {missing}; seen {rejections(witness)}")
