"""Members admitted and revoked after the manifest: reading and writing ``members/``.

Theory of operation
-------------------
The rules are gm_core.members' (pure); this module does the requests. A node of a run
with per-node keys reads ``members/`` when it starts (a node admitted by a certificate
finds its own entry there) and then every :data:`POLL_S` seconds while it runs
(:class:`Watch`, driven by the runtime): one LIST, and a GET for each new object at a
slot name the run key gives (an outsider's keys there are never downloaded: it cannot
compute a slot name), each judged once per ETag. What it learns is put in force in both
machines of the node (:meth:`gm_shell.runtime.Runtime.learn_members`) and reported as
:class:`~gm_shell.events.MemberLearned`; an object that is not the authority's word as
:class:`~gm_shell.events.MemberRefused`, once.

The authority writes with :func:`write` (``gm roster add`` and ``gm roster revoke``):
create-once at the node's lowest free slot, so garbage a member put at a slot costs one
slot more, never the admission.

Cost: one LIST per node every :data:`POLL_S` seconds (a few per hour-long round at most;
none in runs without per-node keys) and a GET per new member object.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gm_core import auth, keys, members, records
from gm_core.auth import Envelope, Signing, Unauthenticated
from gm_core.records import Certificate, Revocation
from gm_shell import events
from gm_shell.limits import MAX_LISTED_KEYS
from gm_shell.mailbox import Mailbox, PutOutcome
from gm_shell.reads import read_json

POLL_S = 10.0
"""Seconds between two looks at ``members/`` by a running node."""

_JUDGED = 4 * members.MAX_LEARNED
"""Member objects whose verdict a watch remembers by ETag, at most."""


class MembersFullError(RuntimeError):
    """Every slot of a node's member key is taken: the authority cannot write there."""


@attrs.frozen(kw_only=True)
class Learned:
    """What one look at ``members/`` found: the signing in force after it, and what to say."""

    signing: Signing
    changed: bool
    events: tuple[events.Event, ...] = ()


class Watch:
    """What one node knows of ``members/``, and the objects it has judged (by ETag)."""

    def __init__(self, envelope: Envelope, node: str, clock: Callable[[], float]) -> None:
        assert envelope.auth is not None
        assert envelope.auth.signing is not None
        self.envelope = envelope
        self._node = node
        self._clock = clock
        self._judged: dict[str, str] = {}

    @property
    def signing(self) -> Signing:
        assert self.envelope.auth is not None
        assert self.envelope.auth.signing is not None
        return self.envelope.auth.signing

    def judge_by(self, signing: Signing) -> None:
        """Go on from ``signing`` (the node's own, once it signs as a member)."""
        self.envelope = members.reseal(self.envelope, signing)

    async def look(self, mailbox: Mailbox) -> Learned:
        """List ``members/``, judge what is new, and learn it (in slot order per node)."""
        listed, _ = await mailbox.list_capped(keys.members_prefix(), max_keys=MAX_LISTED_KEYS)
        found: list[tuple[str, int, str, str]] = []
        for item in listed:
            if self._judged.get(item.key) == item.etag:
                continue
            try:
                parsed = keys.parse(item.key)
            except keys.BadKey:
                continue
            if not isinstance(parsed, keys.MemberKey):
                continue
            slot = members.member_slot(self.envelope, parsed)
            if slot is not None:  # a foreign name: not the run's, never downloaded
                found.append((parsed.node, slot, item.key, item.etag))
        signing, said = self.signing, list[events.Event]()
        for _, _, key, etag in sorted(found):
            if len(self._judged) >= _JUDGED:
                break
            self._judged[key] = etag
            data = await read_json(mailbox, key)
            if data is None:
                continue
            word = members.judge(self.envelope, signing, key, data)
            if isinstance(word, Unauthenticated):
                said.append(self._refused(key, f"{word.why}: {word.detail}"))
                continue
            before = signing
            signing, note = members.learn(signing, word)
            if note is not None:
                refused = signing is before  # a word that cannot count says why
                said.append(self._refused(key, note) if refused else self._learned(word, note))
        changed = signing is not self.signing
        self.judge_by(signing)
        return Learned(signing=signing, changed=changed, events=tuple(said))

    def _refused(self, key: str, detail: str) -> events.Event:
        at_s = self._clock()
        return events.MemberRefused(node=self._node, round=-1, detail=detail, at_s=at_s, key=key)

    def _learned(self, word: members.Word, note: str) -> events.Event:
        return events.MemberLearned(
            node=self._node,
            round=word.from_round if isinstance(word, Revocation) else -1,
            detail=note,
            at_s=self._clock(),
            member=_node_of(word),
            revoked=isinstance(word, Revocation),
        )


def _node_of(word: members.Word) -> str:
    return word.member.node if isinstance(word, Certificate) else word.node


async def learn_all(
    mailbox: Mailbox, run_auth: auth.RunAuth, manifest: records.Manifest
) -> tuple[Signing, tuple[events.Event, ...]]:
    """Everything ``members/`` says now, in force on ``run_auth``'s signing (one look)."""
    watch = Watch(auth.of_run(manifest, run_auth), "", lambda: 0.0)
    learned = await watch.look(mailbox)
    return learned.signing, learned.events


async def write(mailbox: Mailbox, envelope: Envelope, word: members.Word) -> str:
    """Write the authority's ``word`` at its node's lowest free slot; returns the key."""
    node = _node_of(word)
    for slot in range(members.SLOTS):
        key = members.member_key(envelope, node, slot)
        if await mailbox.put_once(key, envelope.pack(key, word)) is PutOutcome.CREATED:
            return key
    raise MembersFullError(f"all {members.SLOTS} slots of {keys.members_prefix(node)} are taken")


class RevokedError(RuntimeError):
    """The run authority revoked this node (``gm roster revoke``), and the node learned it
    from ``members/`` while it ran: it stops, since from the round the revocation names the
    run refuses everything it signs, and its lease at once (spec/protocol.md §16.3.3). Going
    on would only cost the store requests nobody counts; a node started again under the
    same id is refused at start (:class:`~gm_shell.nodekeys.NodeKeyError`)."""


class AuthorityError(ValueError):
    """``gm roster add``/``revoke`` cannot speak for this run; the message says why."""


async def _as_authority(box: Mailbox, run_auth: auth.RunAuth, authority: bytes) -> Envelope:
    """The envelope the authority ``authority`` writes ``members/`` of the run at ``box`` with."""
    from gm_shell import nodekeys
    from gm_shell.run import read_manifest

    manifest = await read_manifest(box, run_auth)
    if manifest is None:
        raise AuthorityError(f"{box.url}: no run here (manifest.json is absent)")
    if manifest.roster is None:
        raise AuthorityError(f"{box.url}: the run has no per-node keys (no roster)")
    if nodekeys.public_key(authority) != manifest.roster.authority:
        raise AuthorityError(
            f"this key is not the run's authority ({manifest.roster.authority}): "
            "nodes would refuse what it signs"
        )
    return auth.of_run(manifest, nodekeys.reader(run_auth, manifest))


async def admit(
    box: Mailbox, run_auth: auth.RunAuth, authority: bytes, member: records.Member
) -> str:
    """Admit ``member`` (a learner) to the run at ``box``; returns the certificate's key."""
    from gm_shell import nodekeys

    envelope = await _as_authority(box, run_auth, authority)
    if records.ROLE_CLOSER in member.roles:
        raise AuthorityError(
            "a certificate admits learners only: closers are on the manifest's roster "
            "(spec/protocol.md §16.3.3)"
        )
    return await write(box, envelope, nodekeys.certify(authority, envelope.run_id, member))


async def shut_out(
    box: Mailbox,
    run_auth: auth.RunAuth,
    authority: bytes,
    node: str,
    *,
    from_round: int | None = None,
    ahead: int = 2,
    reason: str = "",
) -> tuple[str, int]:
    """Revoke ``node`` from ``from_round`` (None: ``ahead`` rounds past the tape's newest
    record, so that every node has learned it before it applies); returns the key and the
    round. A round the tape already holds is refused: the records there stand."""
    from gm_shell import nodekeys, status

    envelope = await _as_authority(box, run_auth, authority)
    rounds = (await status.gather_status(box, last=1, run_auth=run_auth)).rounds
    since = rounds - 1 + ahead if from_round is None else from_round
    if since < rounds:
        raise AuthorityError(
            f"the tape already holds round {rounds - 1}: a revocation applies from round "
            f"{rounds} on at the earliest (what is on the tape stands)"
        )
    word = nodekeys.revoke(authority, envelope.run_id, node, since, reason)
    return await write(box, envelope, word), since
