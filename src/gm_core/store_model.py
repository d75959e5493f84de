"""A model object store: exactly what the protocol assumes of a bucket, as a pure value.

Theory of operation
-------------------
``spec/store-model.md`` states the assumptions; this module is them in code, used
by the stateful tests, the simulator and the model checker. Objects are bytes
with an etag that changes on every write. ``put_once`` is atomic create-once; a
read sees the newest write (read-after-write); a list returns keys in byte order
after an optional offset. Nothing else is promised, so nothing else is modelled:
no rename, no compare-and-swap on overwrite, no ordering between keys.

Every successful create-once write is also appended to ``created``, a ghost
history that the invariants read: objects may later be swept, but the fact that
a snapshot, claim or record was once written is what acceptance soundness and
single-committer checks are about.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen(kw_only=True)
class Stored:
    data: bytes
    etag: str


@attrs.frozen(kw_only=True)
class ModelStore:
    objects: Mapping[str, Stored] = attrs.field(factory=dict)
    created: tuple[tuple[str, bytes], ...] = ()
    writes: int = 0

    def get(self, key: str) -> Stored | None:
        return self.objects.get(key)

    def put_once(self, key: str, data: bytes) -> tuple[ModelStore, bool]:
        """Create ``key`` if free; the bool says whether this call created it."""
        if key in self.objects:
            return self, False
        store = self._write(key, data)
        return attrs.evolve(store, created=(*store.created, (key, data))), True

    def put(self, key: str, data: bytes) -> ModelStore:
        return self._write(key, data)

    def list(self, prefix: str, offset: str | None = None) -> tuple[str, ...]:
        return tuple(
            sorted(
                k for k in self.objects if k.startswith(prefix) and (offset is None or k > offset)
            )
        )

    def delete(self, keys: tuple[str, ...]) -> ModelStore:
        objects = {k: v for k, v in self.objects.items() if k not in keys}
        return attrs.evolve(self, objects=objects)

    def delete_prefix(self, prefix: str) -> ModelStore:
        objects = {k: v for k, v in self.objects.items() if not k.startswith(prefix)}
        return attrs.evolve(self, objects=objects)

    def _write(self, key: str, data: bytes) -> ModelStore:
        objects = dict(self.objects)
        objects[key] = Stored(data=data, etag=f"e{self.writes + 1}")
        return attrs.evolve(self, objects=objects, writes=self.writes + 1)
