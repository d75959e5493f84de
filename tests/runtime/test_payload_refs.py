"""A closer judges each snapshot's payload reference as itself, whatever it read before.

A forger without the run key can point a snapshot at an honest payload's key and declare
another size (the hostile-bucket test's ``evil-declared``: 10 GiB). The runtime's caches
of decoded fragments used to be keyed by the payload key alone, so such a reference was
refused when it came first and accepted — served from the cache — when an honest
reference to the same key had been read before it: CI saw the forger merged once in an
open run on SeaweedFS. Here a real runtime (no machines) verifies references over a
``memory://`` mailbox in both orders.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import attrs
import numpy as np
import pytest
from test_fragments import manifest

from gm_core.commands import Verify
from gm_core.events import Verified
from gm_core.records import PayloadRef, Reason
from gm_shell import events
from gm_shell.fragments import FragmentCodec, Role
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox
from gm_shell.runtime import Runtime

ROUND = 4
"""A round of fragment 0 (two fragments)."""


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    run = manifest()
    loop = LoopThread("gm-test-refs")
    mailbox = Mailbox.open(f"memory://refs-{uuid.uuid4().hex[:10]}/run")
    runtime = Runtime(
        node="n0",
        manifest=run,
        mailbox=mailbox,
        codec=FragmentCodec(run),
        hub=events.EventHub(),
        loop=loop,
        replica=None,
        learner_options=None,
        closer_options=None,
        cache_bytes=None,
    )
    try:
        yield runtime
    finally:
        runtime.shutdown()
        mailbox.close()


def _published(runtime: Runtime) -> PayloadRef:
    """An honest zero delta of fragment 0, in the bucket."""
    codec = FragmentCodec(runtime.manifest)
    data, ref = codec.encode(0, Role.DELTA, ROUND, np.zeros(codec.size(0), np.float32))
    runtime._loop.run(runtime._mailbox.put_once(ref.key, data))
    return ref


def _verdict(runtime: Runtime, ref: PayloadRef) -> Reason | None:
    cmd = Verify(req=1, round=ROUND, learner="x", payload=ref)
    verified = runtime._loop.run(runtime._verify(cmd))
    assert isinstance(verified, Verified), verified
    return verified.reason


@pytest.mark.parametrize("honest_first", [True, False], ids=["honest-first", "forged-first"])
@pytest.mark.parametrize(
    "lie", [{"size": 10 << 30}, {"size": 1}, {"digest": "0" * 64}], ids=["10GiB", "1B", "digest"]
)
def test_a_reference_that_lies_about_an_honest_payload_is_refused_in_either_order(
    runtime: Runtime, honest_first: bool, lie: dict[str, object]
) -> None:
    honest = _published(runtime)
    forged = attrs.evolve(honest, **lie)  # type: ignore[arg-type]
    order = [honest, forged] if honest_first else [forged, honest]
    verdicts = {ref: _verdict(runtime, ref) for ref in order}
    assert verdicts[honest] is None
    assert verdicts[forged] is Reason.CORRUPT
    assert _verdict(runtime, forged) is Reason.CORRUPT  # asked again: the same verdict
