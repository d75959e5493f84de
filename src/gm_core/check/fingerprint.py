"""State fingerprints: two cluster states that behave alike hash alike.

Theory of operation
-------------------
The checker must recognise a state it has seen, whatever path led there. A
:class:`~gm_core.cluster.Cluster` is a tree of frozen attrs values, mappings,
tuples and scalars; :func:`canonical` maps it to nested tuples in a fixed order
(mappings and sets sorted by key), and :func:`fingerprint` hashes their ``repr``
with blake2b (never ``hash()``, which is salted per process).

What is left out is what cannot influence any future transition or invariant:

* values that every state shares by construction (the manifest, the node-local
  options and the schema digest a machine was created with);
* the notifications emitted so far (``Cluster.notes``): output for a user, never
  read back.

And three symmetries are folded. The commands in flight form a *multiset* — a
driver may deliver any of them next, so their order in the tuple is not state.
The store's create-once history is a multiset too: the invariants count and look
up what was created, never in which order, so two creations by different nodes
commute. And etags are abstracted: the store hands out a fresh etag per write
(numbered by a global counter, so two writes to different keys would otherwise not
commute), and the protocol only ever compares a held etag for equality with the
one the store reports later; so a state keeps, per lease a closer watches, only
whether the etag it holds is the lease's current one (:func:`lease_etags`). Node
names are not permuted: they flow into snapshot keys, payload bytes and the
digests of those bytes, and into sorted orders, so two states that differ by a
renaming are not identical values, and folding them would need every digest
recomputed; the checker stays sound by not doing it.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gm_core import closer, cluster, election, keys, liveness
from gm_core.store_model import ModelStore

SKIPPED_FIELDS = frozenset({"manifest", "options", "schema_digest", "notes"})
"""Fields shared by every state of one exploration, or write-only output."""

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


def _store(store: ModelStore) -> Any:
    """Objects by content only; the create-once history as a multiset; no write counter."""
    objects = tuple(sorted((k, v.data) for k, v in store.objects.items()))
    return ("store", objects, tuple(sorted(store.created)))


def _lease_view(view: liveness.LeaseView) -> Any:
    """When it changed and whether it was absent; which etag it holds is judged per state."""
    return ("lease", view.changed_at_s, view.etag is None)


_SPECIAL: dict[type, Callable[[Any], Any]] = {
    ModelStore: _store,
    liveness.LeaseView: _lease_view,
}


def _attrs_form(t: type) -> Callable[[Any], Any]:
    names = tuple(f.name for f in attrs.fields(t) if f.name not in SKIPPED_FIELDS)
    label = t.__name__
    return lambda v: (label, *(canonical(getattr(v, n)) for n in names))


def _mapping_form(v: Any) -> Any:
    return ("{", *sorted((canonical(k), canonical(x)) for k, x in v.items()))


def _set_form(v: Any) -> Any:
    return ("set", *sorted(canonical(x) for x in v))


def _sequence_form(v: Any) -> Any:
    return tuple(canonical(x) for x in v)


def _form_of(t: type) -> Callable[[Any], Any]:
    """How to canonicalize a value of type ``t`` (decided once per type)."""
    if t in _SPECIAL:
        return _SPECIAL[t]
    if attrs.has(t):
        return _attrs_form(t)
    if issubclass(t, enum.Enum):
        return lambda v: v.value
    if issubclass(t, Mapping):
        return _mapping_form
    if issubclass(t, frozenset | set):
        return _set_form
    if issubclass(t, tuple | list):
        return _sequence_form
    raise TypeError(f"cannot fingerprint a {t.__name__}")


_FORMS: dict[type, Callable[[Any], Any]] = {}


def canonical(value: Any) -> Any:
    """Nested tuples of scalars, equal for values that behave alike."""
    t = type(value)
    if t in _SCALARS:
        return value
    form = _FORMS.get(t)
    if form is None:
        form = _FORMS[t] = _form_of(t)
    return form(value)


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(repr(value).encode(), digest_size=16).digest()


class Fingerprinter:
    """Fingerprints of cluster states, reusing the digests of parts states share.

    Successive states share most of their parts (one action changes one node, and
    the store only on writes); each part's digest is remembered by object identity
    while the object is held here, and the memo is dropped when it grows large.
    """

    def __init__(self, memo_limit: int = 200_000) -> None:
        self._memo: dict[int, tuple[object, bytes]] = {}
        self._limit = memo_limit

    def part(self, value: object) -> bytes:
        hit = self._memo.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        if len(self._memo) >= self._limit:
            self._memo.clear()
        digest = _digest(canonical(value))
        self._memo[id(value)] = (value, digest)
        return digest

    def state(self, c: cluster.Cluster) -> bytes:
        """A 128-bit fingerprint of a cluster state, with in-flight commands as a multiset."""
        nodes = tuple(self.part(c.nodes[name]) for name in sorted(c.nodes))
        inflight = tuple(sorted(self.part(f) for f in c.inflight))
        rest = (c.now_s, canonical(c.hostile), canonical(c.violations), lease_etags(c))
        return _digest((nodes, self.part(c.store), inflight, rest))

    def store(self, store: ModelStore) -> bytes:
        """What the store-only invariants see: objects and the create-once history."""
        return self.part(store)


def _watched(state: closer.CloserState) -> str:
    """The closer a follower watches: the record's named closer, or the top claim's."""
    named = state.last.next_closer if state.last is not None else state.manifest.created_by
    return election.rightful_closer(named, state.claims)[0]


def lease_etags(c: cluster.Cluster) -> tuple[tuple[str, str, str], ...]:
    """For each lease etag a closer holds: is it the lease's current etag, or an old one?

    Etags are compared only for equality, and every new write gets a fresh one, so
    this is all of an etag that can matter: a held etag equal to the current one
    stays equal until the next renewal; an old one never equals anything again.
    """
    out: list[tuple[str, str, str]] = []
    for name in sorted(c.nodes):
        state = c.nodes[name].closer
        if state is None:
            continue
        views = dict(state.leases)
        watched = _watched(state)
        if state.closer_lease is not None and watched:
            views[f"closer:{watched}"] = state.closer_lease
        for who, view in sorted(views.items()):
            target = who.removeprefix("closer:")
            current = c.store.get(keys.lease(target)) if keys.valid_id(target) else None
            held = "none" if view.etag is None else "old"
            if current is not None and view.etag == current.etag:
                held = "current"
            out.append((name, who, held))
    return tuple(out)


def fingerprint(c: cluster.Cluster) -> bytes:
    """A state's fingerprint, computed from scratch."""
    return Fingerprinter().state(c)
