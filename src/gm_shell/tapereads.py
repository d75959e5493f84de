"""One round's record as a one-shot reader finds it: its slots probed in order.

``align()``, ``gm status`` and the demo's tape reader read records once, outside
the machines; they follow the same slot rule (spec/protocol.md §16.4,
:mod:`gm_core.tape`), so every reader of a run agrees on its tape whatever
garbage lies at a round's lower slots.
"""

from __future__ import annotations

import attrs

from gm_core.auth import Envelope
from gm_core.records import AlgorithmConfig, RoundRecord
from gm_core.tape import BadRecord, SlotCursor, after, parse_record, record_key, slot_of
from gm_shell.mailbox import Mailbox
from gm_shell.reads import read_json


@attrs.frozen
class SlotRead:
    """What probing one round's record key found.

    ``record``: the round's record; None when it is not written (yet); a
    :class:`BadRecord` when the probe stopped at an object it cannot use (a newer
    format's, or the last slot's when every slot is invalid). ``skipped``: the
    invalid objects below it, in slot order (garbage, forgeries, overwrites).
    """

    record: RoundRecord | BadRecord | None
    skipped: tuple[BadRecord, ...] = ()


async def read_record(
    box: Mailbox, envelope: Envelope, config: AlgorithmConfig, round_: int, prev: str | None = None
) -> SlotRead:
    """Probe round ``round_``'s record key slot by slot, as the machines do (with ``prev``,
    a record that does not name it is skipped: :func:`gm_core.tape.expected_prev`)."""
    cursor, skipped = SlotCursor(), list[BadRecord]()
    while True:
        slot = slot_of(cursor, round_)
        data = await read_json(box, record_key(envelope, round_, slot))
        if data is None:
            return SlotRead(None, tuple(skipped))
        parsed = parse_record(envelope, data, round_, config, slot, prev)
        going_on = after(cursor, parsed)
        if going_on is None:
            return SlotRead(parsed, tuple(skipped))
        assert isinstance(parsed, BadRecord)  # after() goes on only past an invalid object
        skipped.append(parsed)
        cursor = going_on
