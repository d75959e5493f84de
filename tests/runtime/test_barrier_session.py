"""``Session.barrier``: nodes of one run meet at a barrier on their sessions' own loops and
mailboxes, and go on training afterwards (their leases renewed all along)."""

from __future__ import annotations

import threading
import uuid

import pytest
from runtime_worker import torch_model

from gm_shell import DiLoCo, Session, SessionOptions

FAST = SessionOptions(poll_s=0.02, renew_s=0.3, close_timeout_s=10.0, join_timeout_s=30.0)


@pytest.mark.parametrize("run_key", [None, bytes(range(32)).hex()], ids=["open", "keyed"])
def test_nodes_of_a_run_meet_at_a_session_barrier_twice(run_key: str | None) -> None:
    """In an authenticated run the barrier's objects have keyed names (gm_core.barrier):
    the run's nodes still find each other's."""
    url = f"memory://barrier-{uuid.uuid4().hex[:10]}/run"
    algorithm = DiLoCo(sync_every=4, fragments=1, quorum=1, lease_timeout_s=3.0)
    outcomes: dict[str, list[tuple[int | None, tuple[str, ...]]]] = {}
    failures: list[BaseException] = []

    def node(name: str) -> None:
        try:
            model, _ = torch_model(0)
            with Session(
                model, algorithm=algorithm, mailbox=url, node=name, options=FAST, run_key=run_key
            ) as s:
                gate = s.barrier("ready", parties=3, timeout_s=60.0)
                seen = []
                for _ in range(2):
                    members = gate.wait()
                    seen.append((gate.generation, members))
                    for _ in range(4):
                        s.step(samples=1)
                gate.close()
                outcomes[name] = seen
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=node, args=(f"n{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    members = ("n0", "n1", "n2")
    assert outcomes == {n: [(0, members), (1, members)] for n in members}
