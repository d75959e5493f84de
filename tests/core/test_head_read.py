"""A head hint read with the manifest (``Started.head``) starts the walk where reading it
would have: the same walk, the same reads after it, one round trip and one GET fewer.

A starting node reads ``head.json`` beside ``finished.json`` and the manifest and hands
the bytes, unjudged, to its machines. Whatever those bytes are (absent, garbage, another
format, a hint to any round), each machine must end up exactly where it would after
asking for the head itself and getting the same bytes back.
"""

from __future__ import annotations

from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import given

from gm_core import auth, closer, keys, learner
from gm_core import cluster as cl
from gm_core.commands import Command, Get
from gm_core.events import GotObject, HeadRead, Started
from gm_core.records import AlgorithmConfig, Head

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
CONFIG = AlgorithmConfig(sync_every=8, fragments=2, quorum=1)
RUN = cl.create(CONFIG, {"n0": frozenset({L, C})})
OPEN = auth.for_manifest(None)

heads = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.integers(0, keys.ROUND_LIMIT - 1).map(lambda r: OPEN.pack(keys.head(), Head(round=r))),
    st.integers(0, 50).map(lambda r: OPEN.pack(keys.head(), Head(round=r))),
)
"""What ``head.json`` may hold: nothing, garbage, or a hint to any round the codec encodes
(past :data:`gm_core.tape.LAST_ROUND` too), often a near one."""


def fresh(machine: cl.Machine) -> Any:
    if machine is L:
        return learner.initial("n0", RUN.manifest, RUN.schema_digest)
    return closer.initial("n0", RUN.manifest, RUN.schema_digest)


def advance(machine: cl.Machine, state: Any, event: Any) -> tuple[Any, list[Command]]:
    return (learner.advance if machine is L else closer.advance)(state, event)


def unnumbered(cmds: list[Command]) -> list[Command]:
    """Commands without their request numbers (the asking side numbered one more)."""
    return [attrs.evolve(c, req=0) if hasattr(c, "req") else c for c in cmds]


@given(machine=st.sampled_from([L, C]), data=heads)
def test_a_head_read_with_the_manifest_starts_the_walk_where_asking_for_it_would(
    machine: cl.Machine, data: bytes | None
) -> None:
    handed, handed_cmds = advance(machine, fresh(machine), Started(now_s=1.0, head=HeadRead(data)))
    asking, first = advance(machine, fresh(machine), Started(now_s=1.0))
    gets = [c for c in first if isinstance(c, Get) and c.key == keys.head()]
    assert len(gets) == 1  # without the bytes, the machine asks for them
    assert not any(isinstance(c, Get) and c.key == keys.head() for c in handed_cmds)
    asked, answered = advance(
        machine, asking, GotObject(now_s=1.0, req=gets[0].req, data=data, etag=None)
    )
    assert handed.walk == asked.walk
    assert handed.phase == asked.phase
    # The reads that follow (the hinted round's record, the lease) are the same ones.
    rest = [c for c in first if c is not gets[0]] + answered
    assert sorted(map(repr, unnumbered(handed_cmds))) == sorted(map(repr, unnumbered(rest)))
