"""Request bookkeeping shared by the learner and the closer machines.

Theory of operation
-------------------
A machine numbers every command whose outcome it waits for (``req``) and keeps
what the request was for (a :class:`Purpose`) in its ``pending`` map, so the
outcome event can be routed when it comes back — or ignored when it answers a
request the machine no longer waits for (an outcome addressed to an earlier
incarnation, or a forged number). Both machines are frozen attrs values with a
``pending`` map and a ``next_req`` counter; these functions work on either.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs

from gm_core.events import Event, RequestFailed, Unusable

K = TypeVar("K", bound=enum.StrEnum)


@attrs.frozen(kw_only=True)
class Purpose(Generic[K]):
    """What an outstanding request was for: a kind, the round it is about, a name.

    Each machine has its own enum of kinds and dispatches on it with an exhaustive
    ``match`` (the type checker refuses a kind without a branch).
    """

    kind: K
    round: int = -1
    name: str = ""


class Numbered(Protocol):
    @property
    def pending(self) -> Mapping[int, Purpose[Any]]: ...

    @property
    def next_req(self) -> int: ...


S = TypeVar("S", bound=Numbered)


def issue(state: S, purpose: Purpose[Any]) -> tuple[S, int]:
    """Number a new request and remember what it is for."""
    req = state.next_req
    pending = dict(state.pending)
    pending[req] = purpose
    return attrs.evolve(state, pending=pending, next_req=req + 1), req  # type: ignore[misc]


def settle(state: S, req: int) -> tuple[S, Purpose[Any] | None]:
    """Forget request ``req`` now that its outcome is here; None if we never asked."""
    purpose = state.pending.get(req)
    if purpose is None:
        return state, None
    pending = dict(state.pending)
    del pending[req]
    return attrs.evolve(state, pending=pending), purpose  # type: ignore[misc]


def failure(event: Event) -> str:
    """A short description of why an outcome is not the success that was hoped for."""
    if isinstance(event, RequestFailed):
        return event.error
    if isinstance(event, Unusable):
        return f"{event.reason}: {event.detail}"
    return type(event).__name__
