"""How many bytes a reader accepts from each kind of object in the bucket.

Theory of operation
-------------------
Every object in the bucket is hostile until judged (DESIGN.md §7), and judging it
starts with its size: a reader asks the store for an object with a cap
(:meth:`gm_shell.mailbox.Mailbox.get` ``max_bytes``), and anything bigger is
refused from its reply's headers, before its body is downloaded. The caps here
are for the JSON records, by the kind the key names; payloads are bounded by their
fragment's layout instead (:meth:`gm_shell.fragments.FragmentCodec.limit`).

Listings are capped too (:data:`MAX_LISTED_KEYS`): a folder anyone can flood with
keys (a round's snapshots, the leases, the claims) costs a node at most
:data:`MAX_LIST_PAGES` pages per listing, whatever lies in it (protocol.md §16.4.5).

The caps are generous for the largest record a correct writer can produce:

- a **snapshot**, **claim**, **lease**, **head** or **follow** marker has a fixed set of
  fields whose values are bounded (ids of at most 64 characters, 64-bit numbers, one payload
  reference): well under 1 KiB encoded (``tests/mailbox/test_bounded.py`` encodes the
  largest of each), so 64 KiB leaves room for a signature and later fields;
- a **round record** grows with the number of fragments (its frontier) and of
  learners (participants, rejections), and a **manifest** with the schema: neither is
  bounded by the protocol, so both get the codec's own limit,
  :data:`gm_core.codec.MAX_RECORD_BYTES`, beyond which no reader could decode them.
"""

from __future__ import annotations

from typing import Final

from gm_core import codec, keys

SMALL_RECORD_BYTES: Final = 64 << 10
"""Cap of snapshots, claims, leases, the head hint, follow markers and member objects."""


def json_limit(key: str) -> int:
    """The most bytes a reader downloads of the JSON object at ``key``.

    A key that does not parse as a protocol key (no reader here asks for one) gets
    the codec's limit, the bound every record shares.
    """
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return codec.MAX_RECORD_BYTES
    small = (
        keys.SnapshotKey
        | keys.ClaimKey
        | keys.LeaseKey
        | keys.HeadKey
        | keys.FollowKey
        | keys.MemberKey
    )
    if isinstance(parsed, small):
        return SMALL_RECORD_BYTES
    return codec.MAX_RECORD_BYTES


LIST_PAGE_KEYS: Final = 1000
"""Keys in one page of a listing (S3, R2 and GCS return at most this many per request)."""
MAX_LIST_PAGES: Final = 4
"""Pages a node reads of one listing; the rest of a flooded folder is not looked at."""
MAX_LISTED_KEYS: Final = MAX_LIST_PAGES * LIST_PAGE_KEYS
"""Keys a node reads of one listing: far above a round's snapshots or a run's leases."""
