"""Typed events from the core's notifications; slow or failing callbacks never stall the loop."""

from __future__ import annotations

import logging
import threading

import pytest

from gm_core.commands import Notify
from gm_core.records import Reason
from gm_shell import events


def typed(kind: str, detail: str = "", round_: int = 7) -> events.Event:
    return events.from_notify(Notify(kind=kind, round=round_, detail=detail), "n0", 1.5)


def test_every_kind_the_core_sends_has_a_class_and_its_fields() -> None:
    committed = typed("committed", "version=3 participants=2")
    assert committed == events.Committed(
        node="n0", round=7, detail="version=3 participants=2", at_s=1.5, version=3, participants=2
    )
    rejected = typed("rejected", "evil: nonfinite")
    assert isinstance(rejected, events.Rejected)
    assert (rejected.learner, rejected.reason) == ("evil", Reason.NONFINITE)
    assert typed("took_over", "claim=2") == events.TookOver(
        node="n0", round=7, detail="claim=2", at_s=1.5, claim=2
    )
    superseded = typed("superseded", "by n1")
    assert isinstance(superseded, events.Superseded)
    assert superseded.by == "n1"
    published = typed("published", "steps=12")
    assert isinstance(published, events.Published)
    assert published.steps == 12
    for kind in ("joined", "closed", "lease_failed", "bad_key", "record_rejected", "merge_failed"):
        assert typed(kind).kind == kind


def test_a_kind_this_shell_does_not_know_is_passed_on_not_refused() -> None:
    other = typed("brand_new", "x=1")
    assert isinstance(other, events.Other)
    assert (other.name, other.detail) == ("brand_new", "x=1")


def test_slow_and_failing_callbacks_never_block_the_emitter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    seen: list[events.Event] = []

    def blocked(event: events.Event) -> None:
        release.wait(timeout=60)

    def failing(event: events.Event) -> None:
        raise RuntimeError("callback bug")

    hub = events.EventHub([blocked, failing, seen.append], capacity=4)
    for i in range(50):  # would hang here if emit waited for the blocked callback
        hub.emit(typed("joined", round_=i))
    assert hub.dropped >= 50 - 4 - 1
    assert len(hub.recent) == 50
    release.set()
    with caplog.at_level(logging.ERROR, logger="gm"):
        hub.close()
    assert seen, "later callbacks still run after one failed"
    assert "callback bug" in caplog.text


def test_only_rejections_a_user_can_act_on_are_warnings(caplog: pytest.LogCaptureFixture) -> None:
    hub = events.EventHub([])
    with caplog.at_level(logging.DEBUG, logger="gm"):
        for reason in Reason:
            hub.emit(typed("rejected", f"n1: {reason.value}"))
        hub.emit(typed("rejected", "n1: something_newer"))
        hub.close()
    levels = {r.getMessage().rsplit(": ", 1)[-1].rstrip(")"): r.levelname for r in caplog.records}
    assert levels == {
        "zero_steps": "INFO",
        "stale": "INFO",
        "missing": "INFO",
        "schema": "WARNING",
        "corrupt": "WARNING",
        "nonfinite": "WARNING",
        "unsigned": "WARNING",
        "unauthenticated": "WARNING",
        "outlier": "WARNING",
        "something_newer": "WARNING",
    }
