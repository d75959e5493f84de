"""A cluster of learner and closer machines around a model store, as one pure value.

Theory of operation
-------------------
This is the shell of the tests, the simulator and the model checker: it
interprets commands against :class:`~gm_core.store_model.ModelStore` and feeds
outcomes back through the real ``advance`` functions. Nothing happens on its
own: a driver picks the next action — deliver one in-flight command (normally,
as a failure, or with its response lost after the write landed), fire a timer,
let a learner train, crash or restart a node, move the clock — so a random
driver explores interleavings and an exhaustive one enumerates them.

Tensors are abstract: a payload is a few bytes naming who made it, and its
digest is their blake2b hash, which is enough to check hashes, to detect a
poisoned (non-finite) delta and to keep every pointer honest.

The harness also judges the moment invariants, since only it sees the moments:
payload before pointer and the closing rule when it carries out a create-once
write, the merge weights when it carries out a merge, learner monotonicity on
every learner transition. For the closing rule it keeps ghost state per node
(``Node.decided``): at the transition where the node's closer finds its round
ready to close, the harness takes what it knew from its state — its verdicts,
and whom its lease views showed live — and judges the rule on it; the verdict is
reported when that closer creates the round's record (a closer that decided
wrongly but never committed has not broken the rule). Only the round and the
verdict are kept, so the ghost adds no state to a correct run that its closer's
state does not already hold (the model checker's state counts stay put).
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs

from gm_core import auth, closer, codec, invariants, keys, learner, modelkeys, plan, slots
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Fetch,
    Get,
    List,
    Merge,
    Notify,
    Pace,
    Probe,
    PutOnce,
    PutOver,
    Share,
    Verify,
    WakeAt,
)
from gm_core.events import (
    Aligned,
    Captured,
    CloseRequested,
    Deleted,
    Event,
    GotObject,
    Listed,
    Merged,
    Probed,
    PutDone,
    RequestFailed,
    Shared,
    Started,
    Stepped,
    TimerFired,
    Unusable,
    Verified,
)
from gm_core.records import (
    FORMAT_VERSION,
    ROLE_CLOSER,
    ROLE_LEARNER,
    AlgorithmConfig,
    FragmentState,
    Manifest,
    PayloadRef,
    Reason,
    RoundRecord,
    Snapshot,
    TensorSpec,
)
from gm_core.store_model import ModelStore, Stored

POISON = b"|nan"
"""Marks an abstract payload whose tensor holds a NaN."""


class Fault(enum.StrEnum):
    NONE = "none"
    FAIL = "fail"
    LOSE_RESPONSE = "lose_response"


class Machine(enum.StrEnum):
    LEARNER = "learner"
    CLOSER = "closer"


@attrs.frozen(kw_only=True)
class InFlight:
    node: str
    machine: Machine
    incarnation: int
    command: Command


@attrs.frozen(kw_only=True)
class Node:
    name: str
    incarnation: int = 0
    alive: bool = True
    learner: learner.LearnerState | None = None
    closer: closer.CloserState | None = None
    timers: Mapping[Machine, float] = attrs.field(factory=dict)
    step: int = 0
    tokens: int = 0
    pace: Pace | None = None
    poison: bool = False
    decided: tuple[int, tuple[str, ...]] | None = None
    """Ghost: the round the closer found ready, and the closing rule's verdict on what it
    knew then (None: not ready)."""


@attrs.frozen(kw_only=True)
class Cluster:
    manifest: Manifest
    schema_digest: str
    store: ModelStore
    nodes: Mapping[str, Node]
    roles: Mapping[str, frozenset[Machine]]
    inflight: tuple[InFlight, ...] = ()
    now_s: float = 0.0
    notes: tuple[tuple[str, Notify], ...] = ()
    violations: tuple[invariants.Violation, ...] = ()
    hostile: frozenset[str] = frozenset()
    tampered: frozenset[str] = frozenset()
    """Keys of the protocol's own objects that outsiders deleted or overwrote (:func:`tamper`)."""
    learner_options: learner.LearnerOptions = attrs.field(factory=learner.LearnerOptions)
    closer_options: closer.CloserOptions = attrs.field(factory=closer.CloserOptions)
    run_auth: auth.RunAuth | None = None
    """The run key's subkeys (an authenticated run), None for an open one."""
    list_cap: int | None = None
    """The most keys a listing returns, the rest cut (the shell's cap, gm_shell.limits)."""
    cosines: Mapping[int, float] = attrs.field(factory=dict)
    """The mean pairwise cosine a merge of two or more deltas reports, by round
    (:func:`set_cosine`); abstract tensors have none of their own."""


def payload_bytes(*parts: object) -> bytes:
    return "|".join(str(p) for p in parts).encode()


def digest_of(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def _ref(round_: int, data: bytes) -> PayloadRef:
    digest = digest_of(data)
    return PayloadRef(key=keys.payload(round_, digest), size=len(data), digest=digest)


SCHEMA = (
    TensorSpec(name="w0", shape=(4,), dtype="F32"),
    TensorSpec(name="w1", shape=(4,), dtype="F32"),
)


def create(
    config: AlgorithmConfig,
    roles: Mapping[str, frozenset[Machine]],
    *,
    schema: tuple[TensorSpec, ...] = SCHEMA,
    learner_options: learner.LearnerOptions | None = None,
    closer_options: closer.CloserOptions | None = None,
    run_key: bytes | None = None,
    list_cap: int | None = None,
    members: Mapping[str, tuple[str, ...]] | None = None,
    wire_format: int = FORMAT_VERSION,
    revoked: Mapping[str, int] | None = None,
) -> Cluster:
    """A run whose manifest and initial payloads are in the store; nodes not yet started.

    With ``run_key`` the run is authenticated: every node seals and opens its objects
    with it, and the invariants judge the objects that open (everything else is an
    outsider's). With ``list_cap`` a listing returns at most that many keys (and says so).
    With ``members`` (and a run key) the run has per-node keys (spec/protocol.md §16.3,
    gm_core.modelkeys' stand-in scheme): its roster admits every node with the roles of
    its machines, plus ``members`` (ids that are not nodes, e.g. a forger that is a
    member, with their roles); every node signs as itself.
    With ``revoked`` (and ``members``), node -> round: revocations every node holds from the
    start, as if each had learned them from ``members/`` (spec/protocol.md §16.3.3).
    With ``wire_format`` 2 the run is a format-2 run (spec/protocol.md §16.7), whose claims
    are named in an open run too (§16.4.4); 1, the default: the checker's pinned sets.
    """
    run_auth = None if run_key is None else auth.derive(run_key)
    roster = None
    if members is not None and run_auth is not None:
        granted = {n: _roster_roles(r) for n, r in roles.items()}
        roster = modelkeys.roster({**granted, **members})
        reading = modelkeys.signing(roster, None)
        if revoked:
            reading = attrs.evolve(reading, revoked=tuple(sorted(revoked.items())))
        run_auth = attrs.evolve(run_auth, signing=reading)
    fragment_plan = plan.make_plan(schema, config)
    store = ModelStore()
    init = []
    for fragment in range(config.fragments):
        data = payload_bytes("init", fragment)
        ref = _ref(0, data)
        store, _ = store.put_once(ref.key, data)
        init.append(FragmentState(version=0, theta=ref, momentum=None))
    first = min(n for n, r in roles.items() if Machine.CLOSER in r)
    manifest = Manifest(
        run_id="run",
        created_by=first,
        config=config,
        schema=schema,
        plan=fragment_plan,
        init=tuple(init),
        auth=auth.info(run_auth),
        chained=True,
        roster=roster,
        format=wire_format,
    )
    return Cluster(
        manifest=manifest,
        schema_digest=plan.schema_digest(schema),
        store=store,
        nodes={name: Node(name=name, alive=False) for name in sorted(roles)},
        roles=dict(roles),
        learner_options=_clocked(learner_options or learner.LearnerOptions(), run_auth),
        closer_options=_clocked(closer_options or closer.CloserOptions(), run_auth),
        run_auth=run_auth,
        list_cap=list_cap,
    )


def _roster_roles(machines: frozenset[Machine]) -> tuple[str, ...]:
    return tuple(
        role
        for role, machine in ((ROLE_LEARNER, Machine.LEARNER), (ROLE_CLOSER, Machine.CLOSER))
        if machine in machines
    )


def node_auth(c: Cluster, name: str) -> auth.RunAuth | None:
    """The keys node ``name`` runs with: the run's, signing as itself with per-node keys."""
    run_auth = c.run_auth
    if run_auth is None or run_auth.signing is None:
        return run_auth
    signing = modelkeys.signing(run_auth.signing.roster, name)
    if run_auth.signing.revoked:  # what every node holds of the authority's word
        signing = attrs.evolve(signing, revoked=run_auth.signing.revoked)
    return attrs.evolve(run_auth, signing=signing)


_Options = TypeVar("_Options", learner.LearnerOptions, closer.CloserOptions)


def _clocked(options: _Options, run_auth: auth.RunAuth | None) -> _Options:
    """Options whose lease sequence numbers follow the cluster's clock in an authenticated run,
    as the shell's follow the wall clock: a restarted node's renewals must count (§16.6)."""
    if run_auth is None or options.lease_epoch_us is not None:
        return options
    return attrs.evolve(options, lease_epoch_us=0)


def _envelope(c: Cluster) -> auth.Envelope:
    return auth.of_run(c.manifest, c.run_auth)


def _body(c: Cluster, key: str, data: bytes) -> bytes | None:
    """The body of an object the run's nodes wrote (payloads are bare), None for any other."""
    if c.run_auth is None or key.startswith(keys.PAYLOADS_PREFIX):
        return data
    return _opened_body(_envelope(c), key, data)


@functools.lru_cache(maxsize=65536)
def _opened_body(envelope: auth.Envelope, key: str, data: bytes) -> bytes | None:
    """Objects are immutable bytes, judged after every step: each is opened once."""
    body = envelope.open(key, data)
    return body if isinstance(body, bytes) else None


def _opened(c: Cluster, store: ModelStore) -> ModelStore:
    """``store`` as the invariants read it: bodies without envelopes, less what does not open."""
    if c.run_auth is None:
        return store
    objects = {}
    for key, stored in store.objects.items():
        body = _body(c, key, stored.data)
        if body is not None:
            objects[key] = Stored(data=body, etag=stored.etag)
    created = []
    for key, data in store.created:
        body = _body(c, key, data)
        if body is not None:
            created.append((key, body))
    return attrs.evolve(store, objects=objects, created=tuple(created))


def view(c: Cluster) -> invariants.ClusterView:
    """What the invariants judge: the nodes, and the store less what outsiders wrote."""
    store = c.store
    if c.hostile or c.tampered:  # a tampered key's writes (a restore too) are not the protocol's
        outside = c.hostile | c.tampered
        store = attrs.evolve(
            store.delete(tuple(c.hostile)),
            created=tuple((k, d) for k, d in store.created if k not in outside),
        )
    store = _opened(c, store)
    return invariants.ClusterView(
        manifest=c.manifest,
        schema_digest=c.schema_digest,
        store=store,
        learners={n.name: n.learner for n in c.nodes.values() if n.alive and n.learner},
        closers={n.name: n.closer for n in c.nodes.values() if n.alive and n.closer},
        members=frozenset(c.nodes),
        tampered=c.tampered,
    )


def check(c: Cluster) -> list[invariants.Violation]:
    """Every state invariant plus every moment-invariant violation recorded so far."""
    return [*c.violations, *invariants.check(view(c))]


# --- feeding machines ---------------------------------------------------------------------------


def _feed(c: Cluster, name: str, machine: Machine, event: Event) -> Cluster:
    """Run one event through a node's machine and queue the commands it returns."""
    node = c.nodes[name]
    cmds: list[Command]
    changed: dict[str, Any]  # the node's new fields, set at once: this runs millions of times
    if machine is Machine.LEARNER:
        assert node.learner is not None
        old = node.learner
        new_l, cmds = learner.advance(old, event)
        broken = invariants.learner_monotonic(old, new_l)
        c = _record(c, "learner_monotonic", broken)
        if new_l.follow_round >= 0 and new_l.follow_round != old.follow_round:
            created = _created_under(c, keys.follow(new_l.follow_round))
            found = invariants.follow_after_marker(name, new_l.follow_round, created)
            c = _record(c, "follow_after_marker", found)
        changed = {"learner": new_l}
    else:
        assert node.closer is not None
        old_c = node.closer
        new_c, cmds = closer.advance(old_c, event)
        changed = {"closer": new_c, "decided": _decided(c, node.decided, old_c, new_c)}
        for cmd in cmds:
            if isinstance(cmd, PutOnce) and cmd.key.startswith(keys.FOLLOW_PREFIX):
                c = _follow_written(c, new_c, event.now_s, cmd)
    queued = list(c.inflight)
    notes = list(c.notes)
    timers = dict(node.timers)
    shares: list[Share] = []
    for cmd in cmds:
        if isinstance(cmd, WakeAt):
            timers[machine] = cmd.at_s
        elif isinstance(cmd, Pace):
            changed["pace"] = cmd
        elif isinstance(cmd, Notify):
            notes.append((name, cmd))
        elif isinstance(cmd, Fetch):
            continue  # a read ahead of a load: the model's store has nothing to keep it in
        elif isinstance(cmd, Share):
            shares.append(cmd)
        else:
            queued.append(
                InFlight(node=name, machine=machine, incarnation=node.incarnation, command=cmd)
            )
    nodes = dict(c.nodes)
    nodes[name] = attrs.evolve(node, timers=timers, **changed)
    c = attrs.evolve(c, nodes=nodes, inflight=tuple(queued), notes=tuple(notes))
    for share in shares:
        c = _share(c, name, machine, share, event.now_s)
    return c


def other_machine(machine: Machine) -> Machine:
    return Machine.CLOSER if machine is Machine.LEARNER else Machine.LEARNER


def _share(c: Cluster, name: str, machine: Machine, share: Share, now_s: float) -> Cluster:
    """Feed ``share`` to the node's other machine, if it runs one, in the same action: the
    shell does it in the same turn of its loop, after the machine's other commands.
    (Looked up at call time: the model checker's sleep sets note who was told.)"""
    other = other_machine(machine)
    node = c.nodes[name]
    if (node.closer if other is Machine.CLOSER else node.learner) is None:
        return c
    return _feed(c, name, other, Shared(now_s=now_s, key=share.key, data=share.data))


def _decided(
    c: Cluster,
    decided: tuple[int, tuple[str, ...]] | None,
    old: closer.CloserState,
    new: closer.CloserState,
) -> tuple[int, tuple[str, ...]] | None:
    """Judge the closing rule at the transition where the closer finds its round ready."""
    if new.quorum_at_s is None:
        return None
    if (old.round, old.quorum_at_s) == (new.round, new.quorum_at_s):
        return decided
    knew = invariants.knowledge(new, new.quorum_at_s)
    return new.round, invariants.closing_rule(knew, c.manifest.config.quorum)


def _created_under(c: Cluster, prefix: str) -> list[tuple[str, bytes]]:
    """The create-once writes under ``prefix`` as the invariants read them: the run's own
    (an outsider's, or a tampered key's, are not), opened."""
    out = []
    for key, data in c.store.created:
        if key.startswith(prefix) and key not in c.hostile and key not in c.tampered:
            body = _body(c, key, data)
            if body is not None:
                out.append((key, body))
    return out


def _follow_written(c: Cluster, state: closer.CloserState, now_s: float, cmd: PutOnce) -> Cluster:
    """A closer sends its round's ``follow`` marker: judge the write on what it knows now."""
    knew = invariants.knowledge(state, now_s)
    body = _body(c, cmd.key, cmd.data) or b""
    created = _created_under(c, keys.snapshot_prefix(knew.round))
    follow_n = c.manifest.config.follow
    found = invariants.follow_marker_written(knew, follow_n, created, body)
    return _record(c, "follow_marker_written", found)


def _closing(c: Cluster, node: Node, body: bytes) -> Cluster:
    """A record was created: report the closing rule's verdict on its closer's decision."""
    record = codec.decode(RoundRecord, body)  # only closers write round keys
    if node.decided is None or node.decided[0] != record.round:
        found = (f"round {record.round}: {node.name} committed without deciding to close",)
        return _record(c, "closing_rule", found)
    return _record(c, "closing_rule", node.decided[1])


def _record(c: Cluster, name: str, messages: tuple[str, ...]) -> Cluster:
    if not messages:
        return c
    found = tuple(invariants.Violation(invariant=name, message=m) for m in messages)
    return attrs.evolve(c, violations=(*c.violations, *found))


def start(c: Cluster, name: str) -> Cluster:
    """Start (or restart after a crash) a node with fresh machines for its roles."""
    node = c.nodes[name]
    roles = c.roles[name]
    both = Machine.LEARNER in roles
    fresh = Node(
        name=name,
        incarnation=node.incarnation + 1,
        alive=True,
        poison=node.poison,
        learner=learner.initial(
            name, c.manifest, c.schema_digest, c.learner_options, node_auth(c, name)
        )
        if Machine.LEARNER in roles
        else None,
        closer=closer.initial(
            name,
            c.manifest,
            c.schema_digest,
            attrs.evolve(c.closer_options, write_lease=not both, learns_here=both),
            node_auth(c, name),
        )
        if Machine.CLOSER in roles
        else None,
    )
    nodes = dict(c.nodes)
    nodes[name] = fresh
    c = attrs.evolve(c, nodes=nodes)
    for machine in sorted(roles):
        c = _feed(c, name, machine, Started(now_s=c.now_s))
    return c


def crash(c: Cluster, name: str) -> Cluster:
    """Kill a node: its machines vanish and its commands in flight never happen."""
    nodes = dict(c.nodes)
    nodes[name] = Node(
        name=name, incarnation=c.nodes[name].incarnation, alive=False, poison=c.nodes[name].poison
    )
    inflight = tuple(f for f in c.inflight if f.node != name)
    return attrs.evolve(c, nodes=nodes, inflight=inflight)


def close(c: Cluster, name: str) -> Cluster:
    """Close a node's machines; a learner first reports its step, as ``Session.close`` does."""
    node = c.nodes[name]
    if not node.alive:
        return c
    if Machine.LEARNER in c.roles[name] and node.learner is not None:
        c = _feed(
            c, name, Machine.LEARNER, Stepped(now_s=c.now_s, step=node.step, tokens=node.tokens)
        )
    for machine in sorted(c.roles[name]):
        c = _feed(c, name, machine, CloseRequested(now_s=c.now_s))
    return c


def hand_over(c: Cluster, name: str) -> Cluster:
    """An elected ``either`` node stops training: its learner reports its step and closes,
    leaving the lease to the node's closer, as ``Session.run`` does."""
    node = c.nodes[name]
    if not node.alive or node.learner is None:
        return c
    c = _feed(c, name, Machine.LEARNER, Stepped(now_s=c.now_s, step=node.step, tokens=node.tokens))
    return _feed(c, name, Machine.LEARNER, CloseRequested(now_s=c.now_s, keep_lease=True))


def rejoin(c: Cluster, name: str) -> Cluster:
    """An elected ``either`` node the run relieved (another closer leads) trains again: a
    fresh learner machine joins from the tape beside its closer, as ``Session.run`` does;
    the old learner's requests in flight and its timer are void."""
    node = c.nodes[name]
    if not node.alive or node.learner is None:
        return c
    fresh = learner.initial(name, c.manifest, c.schema_digest, c.learner_options, c.run_auth)
    nodes = dict(c.nodes)
    nodes[name] = attrs.evolve(
        node,
        learner=attrs.evolve(fresh, next_req=node.learner.next_req),
        timers={m: at for m, at in node.timers.items() if m is not Machine.LEARNER},
        pace=None,
    )
    inflight = tuple(f for f in c.inflight if not (f.node == name and f.machine is Machine.LEARNER))
    c = attrs.evolve(c, nodes=nodes, inflight=inflight)
    return _feed(c, name, Machine.LEARNER, Started(now_s=c.now_s))


def tick(c: Cluster, seconds: float) -> Cluster:
    return attrs.evolve(c, now_s=c.now_s + seconds)


def due_timers(c: Cluster) -> list[tuple[str, Machine]]:
    return [
        (n.name, m)
        for n in c.nodes.values()
        if n.alive
        for m, at in sorted(n.timers.items())
        if at <= c.now_s
    ]


def fire(c: Cluster, name: str, machine: Machine) -> Cluster:
    node = c.nodes[name]
    timers = dict(node.timers)
    timers.pop(machine, None)
    nodes = dict(c.nodes)
    nodes[name] = attrs.evolve(node, timers=timers)
    return _feed(attrs.evolve(c, nodes=nodes), name, machine, TimerFired(now_s=c.now_s))


def next_timer_s(c: Cluster) -> float | None:
    times = [at for n in c.nodes.values() if n.alive for at in n.timers.values()]
    return min(times, default=None)


def can_train(c: Cluster, name: str) -> bool:
    node = c.nodes[name]
    return (
        node.alive and node.learner is not None and node.pace is not None and not node.pace.stalled
    )


def train(c: Cluster, name: str, steps: int, tokens_per_step: int = 8) -> Cluster:
    """The learner's training loop runs up to ``steps`` steps, stopping at the core's barrier.

    A barrier already passed (the core asks to hear of the next step: a retry or a
    followed round, computed from the last step it was told of) is the very next step, as
    in the shell's ``step()`` (it reports at any step at or past ``next_step``). Before,
    the step counter went back to the barrier here, and the simulator never trained the
    learner again (a slow learner with ``follow`` stopped after two steps).
    """
    node = c.nodes[name]
    if not can_train(c, name):
        return c
    pace = node.pace
    assert pace is not None
    target = node.step + min(steps, max(pace.next_step - node.step, 1))
    node = attrs.evolve(
        node, step=target, tokens=node.tokens + tokens_per_step * (target - node.step)
    )
    nodes = dict(c.nodes)
    nodes[name] = node
    c = attrs.evolve(c, nodes=nodes)
    if target >= pace.next_step:
        c = _feed(
            c, name, Machine.LEARNER, Stepped(now_s=c.now_s, step=node.step, tokens=node.tokens)
        )
    return c


# --- carrying out commands ------------------------------------------------------------------------


def deliver(c: Cluster, index: int, fault: Fault = Fault.NONE) -> Cluster:
    """Carry out one in-flight command and feed its outcome (or a failure) to its machine."""
    item = c.inflight[index]
    c = attrs.evolve(c, inflight=c.inflight[:index] + c.inflight[index + 1 :])
    node = c.nodes[item.node]
    if not node.alive or node.incarnation != item.incarnation:
        return c
    if fault is Fault.FAIL:
        outcome: Event = RequestFailed(
            now_s=c.now_s, req=_req(item.command), error="injected failure"
        )
    else:
        c, outcome = _execute(c, node, item.command)
        if fault is Fault.LOSE_RESPONSE:
            outcome = RequestFailed(now_s=c.now_s, req=_req(item.command), error="response lost")
    return _feed(c, item.node, item.machine, outcome)


def _req(cmd: Command) -> int:
    req = getattr(cmd, "req", None)
    assert isinstance(req, int)
    return req


def _execute(c: Cluster, node: Node, cmd: Command) -> tuple[Cluster, Event]:
    now = c.now_s
    store = c.store
    if isinstance(cmd, Get):
        got = store.get(cmd.key)
        if got is None:
            return c, GotObject(now_s=now, req=cmd.req, data=None, etag=None)
        return c, GotObject(now_s=now, req=cmd.req, data=got.data, etag=got.etag)
    if isinstance(cmd, Probe):
        got = store.get(cmd.key)
        return c, Probed(now_s=now, req=cmd.req, etag=None if got is None else got.etag)
    if isinstance(cmd, PutOnce):
        body = _body(c, cmd.key, cmd.data) or b""
        after, created = store.put_once(cmd.key, cmd.data)
        if created:  # a write that finds its key taken creates nothing: nobody can read it
            c = _record(
                c, "payload_before_pointer", invariants.pointer_targets_exist(store, cmd.key, body)
            )
        if created and isinstance(keys.parse(cmd.key), keys.RoundKey):
            c = _closing(c, node, body)
        return attrs.evolve(c, store=after), PutDone(now_s=now, req=cmd.req, created=created)
    if isinstance(cmd, PutOver):
        return attrs.evolve(c, store=store.put(cmd.key, cmd.data)), PutDone(
            now_s=now, req=cmd.req, created=True
        )
    if isinstance(cmd, List):
        found = store.list(cmd.prefix, cmd.offset)
        cut = c.list_cap is not None and len(found) > c.list_cap
        return c, Listed(now_s=now, req=cmd.req, keys=found[: c.list_cap], cut=cut)
    if isinstance(cmd, Delete):
        return attrs.evolve(c, store=store.delete(cmd.keys)), Deleted(now_s=now, req=cmd.req)
    if isinstance(cmd, DeletePrefix):
        return attrs.evolve(c, store=store.delete_prefix(cmd.prefix)), Deleted(
            now_s=now, req=cmd.req
        )
    return _execute_payload(c, node, cmd)


def _execute_payload(c: Cluster, node: Node, cmd: Command) -> tuple[Cluster, Event]:
    now = c.now_s
    if isinstance(cmd, Capture):
        data = payload_bytes("delta", node.name, cmd.round, node.step) + (
            POISON if node.poison else b""
        )
        ref = _ref(cmd.round, data)
        store, _ = c.store.put_once(ref.key, data)
        return attrs.evolve(c, store=store), Captured(now_s=now, req=cmd.req, payload=ref)
    if isinstance(cmd, Verify):
        return c, Verified(now_s=now, req=cmd.req, reason=_verdict(c, cmd.payload))
    if isinstance(cmd, Merge):
        c = _record(
            c,
            "merge_weights",
            invariants.merge_weights(_opened(c, c.store), cmd, c.manifest.config.max_share),
        )
        return _merge(c, cmd)
    if isinstance(cmd, Align):
        unusable = _unusable(c, cmd.req, (cmd.theta,))
        if unusable is not None:
            return c, unusable
        return c, Aligned(now_s=now, req=cmd.req, step=node.step, tokens=node.tokens)
    raise TypeError(f"not a command the cluster carries out: {cmd!r}")


def _verdict(c: Cluster, ref: PayloadRef) -> Reason | None:
    got = c.store.get(ref.key)
    if got is None:
        return Reason.MISSING
    if digest_of(got.data) != ref.digest or len(got.data) != ref.size:
        return Reason.CORRUPT
    if got.data.endswith(POISON):
        return Reason.NONFINITE
    return None


def _unusable(c: Cluster, req: int, refs: Iterable[PayloadRef | None]) -> Unusable | None:
    """The first of ``refs`` whose payload is unusable, as the shell reports it."""
    for ref in refs:
        reason = None if ref is None else _verdict(c, ref)
        if ref is not None and reason is not None:
            return Unusable(now_s=c.now_s, req=req, key=ref.key, reason=reason, detail=ref.key)
    return None


def _merge(c: Cluster, cmd: Merge) -> tuple[Cluster, Event]:
    now = c.now_s
    needed = (cmd.base.theta, cmd.base.momentum, *(x.payload for x in cmd.contributions))
    unusable = _unusable(c, cmd.req, needed)
    if unusable is not None:
        return c, unusable
    names = ",".join(x.learner for x in cmd.contributions)
    theta_data = payload_bytes("theta", cmd.round, cmd.base.version + 1, names)
    outer_data = payload_bytes("momentum", cmd.round, names)
    store = c.store
    theta = _ref(cmd.round, theta_data)
    store, _ = store.put_once(theta.key, theta_data)
    outer = None
    if not cmd.final_only:
        outer = _ref(cmd.round, outer_data)
        store, _ = store.put_once(outer.key, outer_data)
    cosine = c.cosines.get(cmd.round) if len(cmd.contributions) > 1 else None
    merged = Merged(now_s=now, req=cmd.req, theta=theta, outer=outer, update=None, cosine=cosine)
    return attrs.evolve(c, store=store), merged


# --- faults from outside the protocol, and reading results ---------------------------------


def set_cosine(c: Cluster, round_: int, cosine: float) -> Cluster:
    """A merge of round ``round_`` reports ``cosine`` as its deltas' mean pairwise cosine
    (the simulator's trainer computes it from real deltas; a test picks it)."""
    return attrs.evolve(c, cosines={**c.cosines, round_: cosine})


def set_poison(c: Cluster, name: str, poison: bool) -> Cluster:
    """From now on the node's learner publishes deltas holding a NaN."""
    nodes = dict(c.nodes)
    nodes[name] = attrs.evolve(c.nodes[name], poison=poison)
    return attrs.evolve(c, nodes=nodes)


def inject(c: Cluster, key: str, data: bytes) -> Cluster:
    """Someone outside the protocol writes ``data`` at ``key`` (a hostile or broken writer)."""
    store, created = c.store.put_once(key, data)
    if not created:
        return c
    return attrs.evolve(c, store=store, hostile=c.hostile | {key})


def tamper(c: Cluster, key: str, data: bytes | None = None) -> Cluster:
    """Someone outside the protocol deletes the object at ``key`` and, given ``data``, writes
    those bytes there instead (a bad restore, a lifecycle rule, an attacker)."""
    c = attrs.evolve(c, store=c.store.delete((key,)), tampered=c.tampered | {key})
    return c if data is None else inject(c, key, data)


def clean(c: Cluster, prefix: str = "") -> Cluster:
    """Remove the objects outsiders wrote under ``prefix``, as an operator does once the
    run halts on one (a record of a newer format, or garbage at every slot of a round
    key: protocol.md §14.9), except those at a round the tape holds a record for: that
    record sits at a slot above them, and a later reader stops at the slot emptied below
    it and never reaches it ((I) of protocol.md §16.4.2)."""
    tape = {r.round for r in records(c)}
    gone = frozenset(k for k in c.hostile if k.startswith(prefix) and _round_of(k) not in tape)
    store = c.store.delete(tuple(gone))
    created = tuple((k, d) for k, d in store.created if k not in gone)
    return attrs.evolve(c, store=attrs.evolve(store, created=created), hostile=c.hostile - gone)


def _round_of(key: str) -> int | None:
    """The round a round record's key names (None for any other key)."""
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return None
    return parsed.round if isinstance(parsed, keys.RoundKey) else None


def records(c: Cluster) -> list[RoundRecord]:
    """The tape as the store holds it now, in round order."""
    tape = invariants.read_tape(view(c))
    return [tape[r] for r in sorted(tape)]


def snapshot(c: Cluster, round_: int, learner: str) -> Snapshot | None:
    """``learner``'s snapshot of ``round_`` as the store holds it now: the lowest valid slot's
    (protocol §16.4.2), None when no slot holds one."""
    for slot in range(slots.SLOTS):
        stored = c.store.get(slots.snapshot_key(_envelope(c), round_, learner, slot))
        if stored is None:
            return None
        found = slots.open_snapshot(_envelope(c), round_, learner, slot, stored.data)
        if isinstance(found, Snapshot):
            return found
    return None
