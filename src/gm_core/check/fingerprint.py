"""State fingerprints: two cluster states that behave alike hash alike.

Theory of operation
-------------------
The checker must recognise a state it has seen, whatever path led there. A
:class:`~gm_core.cluster.Cluster` is a tree of frozen attrs values, mappings,
tuples and scalars; :class:`Digests` hashes it bottom up, each compound part
once (its scalars and its parts' digests, in a fixed order: mappings and sets
sorted), remembering each part's digest by identity, since successive states
share almost every part. A state's fingerprint costs only the parts the last
action made new.

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
(numbered by a global counter, so two writes to different keys would otherwise
not commute), and the protocol only ever compares a held etag for equality with
the one the store reports later; so a state keeps, per lease a closer watches,
only whether the etag it holds is the lease's current one
(:meth:`Fingerprinter.lease_etags`).

Node names are not permuted (no symmetry reduction), because the protocol is
not symmetric in them: a closer issues its per-learner requests (lease probes,
snapshot reads) in name order, and one machine's requests complete in the order
it issued them, so the mirror image of a reachable state (n1 did what n2 did, and
the other way round) has its requests in an order no run produces, and its
futures are not the mirror of the original's. Measured with an experimental fold
(names swapped in every string and payload digest; not kept): at
``roles=c,l,l, max_time=0`` it kept 2,061 states where the reachable states fall
into 2,185 orbits, so it would have lost 124 of them.
"""

from __future__ import annotations

import enum
import hashlib
import marshal
import operator
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gm_core import auth, closer, cluster, election, keys, liveness
from gm_core.store_model import ModelStore

SKIPPED_FIELDS = frozenset({"manifest", "options", "schema_digest", "notes"})
"""Fields shared by every state of one exploration, or write-only output."""

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})

Form = Callable[["Digests", Any], Any]
"""How one type is reduced to a tuple of scalars and the digests of its parts."""


def _store(d: Digests, store: ModelStore) -> Any:
    """Objects by content only; the create-once history as a multiset; no write counter."""
    objects = tuple(sorted((k, v.data) for k, v in store.objects.items()))
    return ("store", objects, tuple(sorted(store.created)))


def _lease_view(d: Digests, view: liveness.LeaseView) -> Any:
    """When it changed and whether it was absent; which etag it holds is judged per state."""
    return ("lease", view.changed_at_s, view.etag is None)


def _attrs_form(t: type, skipped: frozenset[str]) -> Form:
    names = [f.name for f in attrs.fields(t) if f.name not in skipped]
    label = t.__name__
    if not names:
        return lambda d, v: (label,)
    if len(names) == 1:  # attrgetter of one name returns the value, not a 1-tuple
        one = names[0]
        return lambda d, v: (label, d.part(getattr(v, one)))
    fields = operator.attrgetter(*names)
    return lambda d, v: (label, *map(d.part, fields(v)))


def _signing_form(d: Digests, v: auth.Signing) -> Any:
    """Per-node keys by what they are: the roster, what was learned since (certificates,
    revocations) and whose key signs (their functions are fixed by those, gm_core.modelkeys)."""
    return ("Signing", d.part(v.roster), d.part(v.certified), d.part(v.revoked), v.node)


def _mapping_form(d: Digests, v: Any) -> Any:
    return ("{", *sorted((d.part(k), d.part(x)) for k, x in v.items()))


def _ordered_mapping_form(d: Digests, v: Any) -> Any:
    """Insertion order kept: a machine that iterates a mapping may act in that order."""
    return ("[{", *((d.part(k), d.part(x)) for k, x in v.items()))


def _set_form(d: Digests, v: Any) -> Any:
    return ("set", *sorted(d.part(x) for x in v))


def _sequence_form(d: Digests, v: Any) -> Any:
    return ("(", *(d.part(x) for x in v))


def _enum_form(d: Digests, v: Any) -> Any:
    return v.value


_INLINE = frozenset({_mapping_form, _ordered_mapping_form, _set_form, _enum_form})
"""Forms whose reduction is kept as it is (a scalar or a tuple) rather than hashed."""


class Digests:
    """Digests of values, each compound part hashed once while it is held here.

    A compound value (attrs instance, mapping, set, sequence) is reduced to a
    tuple of its scalar fields and the digests of its compound fields, and that
    tuple's serialization is hashed with blake2b (never ``hash()``, which is salted
    per process). Successive states share most of their parts — one action changes one
    machine, and the store only on writes — so each part's digest is remembered by
    object identity (the memo holds the object, so its id is not reused). The
    memo has two generations: when the young one is full the old one is dropped,
    and parts still in use are promoted on their next lookup.

    ``abstract`` selects the state fingerprint's view (etags of stored objects and
    leases folded, the store's create-once history as a multiset, the fields of
    :data:`SKIPPED_FIELDS` left out, mappings as sets of items); otherwise every
    field counts and mappings keep their order, which is what a cache of
    transitions must key on.
    """

    def __init__(self, *, abstract: bool = True, memo_limit: int = 400_000) -> None:
        self._young: dict[int, tuple[object, Any]] = {}
        self._old: dict[int, tuple[object, Any]] = {}
        self._limit = memo_limit
        self._abstract = abstract
        self._forms: dict[type, Form] = {auth.Signing: _signing_form}
        if abstract:
            self._forms[ModelStore] = _store
            self._forms[liveness.LeaseView] = _lease_view

    def part(self, value: object) -> Any:
        """A scalar as itself; anything else as the 16-byte digest of its reduction."""
        t = type(value)
        if t in _SCALARS:
            return value
        key = id(value)
        hit = self._young.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        hit = self._old.get(key)
        if hit is not None and hit[0] is value:
            self._young[key] = hit
            return hit[1]
        form = self._forms.get(t)
        if form is None:
            form = self._forms[t] = self._form_of(t)
        reduced = form(self, value)
        # A mapping or set stays a tuple inside its holder's digest: hashing it apart
        # would cost a digest per new timer table for nothing.
        digest = reduced if t in _SCALARS or form in _INLINE else _digest(reduced)
        if len(self._young) >= self._limit:
            self._old = self._young
            self._young = {}
        self._young[key] = (value, digest)
        return digest

    def _form_of(self, t: type) -> Form:
        """How to reduce a value of type ``t`` (decided once per type)."""
        if attrs.has(t):
            return _attrs_form(t, SKIPPED_FIELDS if self._abstract else frozenset())
        if issubclass(t, enum.Enum):
            return _enum_form
        if issubclass(t, Mapping):
            return _mapping_form if self._abstract else _ordered_mapping_form
        if issubclass(t, frozenset | set):
            return _set_form
        if issubclass(t, tuple | list):
            return _sequence_form
        raise TypeError(f"cannot fingerprint a {t.__name__}")


def _digest(value: Any) -> bytes:
    # marshal format 2 writes equal scalars and tuples as equal bytes (no references
    # to shared objects, which format 3 on adds) at a third of the cost of ``repr``.
    return hashlib.blake2b(marshal.dumps(value, 2), digest_size=16).digest()


class Fingerprinter:
    """Fingerprints of cluster states, reusing the digests of the parts states share."""

    def __init__(self, memo_limit: int = 400_000) -> None:
        self.digests = Digests(memo_limit=memo_limit)
        self._held: dict[int, tuple[closer.CloserState, HeldEtags]] = {}

    def state(self, c: cluster.Cluster) -> bytes:
        """A 128-bit fingerprint of a cluster state, with in-flight commands as a multiset."""
        part = self.digests.part
        nodes = tuple(part(c.nodes[name]) for name in sorted(c.nodes))
        inflight = tuple(sorted(part(f) for f in c.inflight))
        rest = (c.now_s, part(c.hostile), part(c.violations), self.lease_etags(c))
        return _digest((nodes, part(c.store), inflight, rest))

    def lease_etags(self, c: cluster.Cluster) -> tuple[tuple[str, str, str], ...]:
        """For each lease etag a closer holds: is it the lease's current etag, or an old one?

        Etags are compared only for equality, and every new write gets a fresh one, so
        this is all of an etag that can matter: a held etag equal to the current one
        stays equal until the next renewal; an old one never equals anything again.
        Each closer state's held etags are listed once (:func:`held_etags`).
        """
        out: list[tuple[str, str, str]] = []
        for name in sorted(c.nodes):
            state = c.nodes[name].closer
            if state is None:
                continue
            hit = self._held.get(id(state))
            if hit is None or hit[0] is not state:
                if len(self._held) >= 100_000:
                    self._held.clear()
                hit = self._held[id(state)] = (state, held_etags(state))
            for who, key, etag in hit[1]:
                current = c.store.get(key) if key is not None else None
                held = "none" if etag is None else "old"
                if current is not None and etag == current.etag:
                    held = "current"
                out.append((name, who, held))
        return tuple(out)

    def store(self, store: ModelStore) -> bytes:
        """What the store-only invariants see: objects and the create-once history."""
        digest: bytes = self.digests.part(store)
        return digest


def _watched(state: closer.CloserState) -> str:
    """The closer a follower watches: the record's named closer, or the top claim's."""
    named = state.last.next_closer if state.last is not None else state.manifest.created_by
    return election.rightful_closer(named, state.claims)[0]


HeldEtags = tuple[tuple[str, str | None, str | None], ...]
"""Per lease view a closer holds: its name, the lease's key (None: not a node id), the etag."""


def held_etags(state: closer.CloserState) -> HeldEtags:
    """The lease views a closer holds, in name order, with the key each one watches."""
    views = dict(state.leases)
    watched = _watched(state)
    if state.closer_lease is not None and watched:
        views[f"closer:{watched}"] = state.closer_lease
    out = []
    for who, view in sorted(views.items()):
        target = who.removeprefix("closer:")
        out.append((who, keys.lease(target) if keys.valid_id(target) else None, view.etag))
    return tuple(out)


def fingerprint(c: cluster.Cluster) -> bytes:
    """A state's fingerprint, computed from scratch."""
    return Fingerprinter().state(c)
