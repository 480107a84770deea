"""The tables of one source partition: overlays, the stream-version guard, the checkpoint.

All tables of an agent for one partition share one Store, so a batch's changes to every
table, the per-stream versions and the checkpoint land in one atomic write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .store import Changes, Store
from .table import Table, TableView

META = "meta"
CHECKPOINT_KEY = b"checkpoint"


def spaces_for(tables: Sequence[Table[Any]]) -> list[str]:
    """The store spaces a partition of these tables needs."""
    out = [META]
    for t in tables:
        out += [t.data_space, t.version_space]
    return out


@dataclass
class Checkpoint:
    """Where a partition's state stands.

    ``offset`` is the next source offset to process (None: nothing processed yet);
    ``changelog`` maps each table to the next changelog offset to restore from.
    """

    offset: int | None = None
    changelog: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    """Per table, the source offset of the last checkpoint record restored from its
    changelog, so that a restore interrupted half-way resumes without losing it."""

    def encode(self) -> bytes:
        return orjson.dumps({"offset": self.offset, "changelog": self.changelog, "seen": self.seen})

    @classmethod
    def decode(cls, raw: bytes | None) -> Checkpoint:
        if raw is None:
            return cls()
        body = orjson.loads(raw)
        return cls(
            offset=body.get("offset"),
            changelog=dict(body.get("changelog") or {}),
            seen=dict(body.get("seen") or {}),
        )

    def advanced(self, offset: int, changelog: dict[str, int]) -> Checkpoint:
        """The checkpoint after a processed batch ending before ``offset``."""
        positions = {**self.changelog, **changelog}
        return Checkpoint(offset=offset, changelog=positions, seen={t: offset for t in positions})


@dataclass
class BatchChanges:
    """What one batch changed: per table data, per stream versions, the next offset."""

    data: dict[str, dict[bytes, bytes | None]]
    versions: dict[bytes, int]
    offset: int

    @property
    def empty(self) -> bool:
        return not self.versions and not any(self.data.values())


def encode_version(version: int) -> bytes:
    return version.to_bytes(8, "big")


def decode_version(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


class PartitionTables:
    """The agent's tables for one partition, as one unit of state."""

    def __init__(self, tables: Sequence[Table[Any]], store: Store, partition: int) -> None:
        self.tables = list(tables)
        self.store = store
        self.partition = partition
        self.views: list[TableView[Any]] = [TableView(t, store, partition) for t in tables]
        self._views_by_name = {view.table.name: view for view in self.views}
        self.checkpoint = Checkpoint.decode(store.get(META, CHECKPOINT_KEY))
        self._vspace = self.tables[0].version_space if self.tables else None
        self._vbatch: dict[bytes, int] = {}
        self._vevent: dict[bytes, int] = {}

    def applied_version(self, stream_id: str) -> int:
        """The last stream version applied for ``stream_id`` (0: none)."""
        key = stream_id.encode()
        version = self._vevent.get(key)
        if version is None:
            version = self._vbatch.get(key)
        if version is not None:
            return version
        if self._vspace is None:
            return 0
        return decode_version(self.store.get(self._vspace, key))

    def record_version(self, stream_id: str, version: int) -> None:
        self._vevent[stream_id.encode()] = version

    def view(self, table: str) -> TableView[Any]:
        """This partition's view of ``table``."""
        return self._views_by_name[table]

    def commit_event(self) -> None:
        for view in self.views:
            view._commit_event()
        if self._vevent:
            self._vbatch.update(self._vevent)
            self._vevent.clear()

    def rollback_event(self) -> None:
        for view in self.views:
            view._rollback_event()
        self._vevent.clear()

    def take_batch(self, next_offset: int) -> BatchChanges:
        """The open batch's changes (the overlays are emptied)."""
        versions, self._vbatch = self._vbatch, {}
        data = {view.table.name: view._take_batch() for view in self.views}
        return BatchChanges(data=data, versions=versions, offset=next_offset)

    def store_changes(self, batch: BatchChanges, checkpoint: Checkpoint) -> Changes:
        """The atomic store write for ``batch`` with ``checkpoint``."""
        encoded: dict[bytes, bytes | None] = {
            k: encode_version(v) for k, v in batch.versions.items()
        }
        changes: dict[str, dict[bytes, bytes | None]] = {}
        for table in self.tables:
            changes[table.data_space] = batch.data.get(table.name, {})
            changes[table.version_space] = encoded
        changes[META] = {CHECKPOINT_KEY: checkpoint.encode()}
        return changes

    def write(self, batch: BatchChanges, checkpoint: Checkpoint) -> None:
        """Write ``batch`` and ``checkpoint`` in one atomic store write (blocking)."""
        self.store.write(self.store_changes(batch, checkpoint))
        self.checkpoint = checkpoint
