"""The changelog format: one compacted topic per agent, one record per changed key.

DESIGN note, the choice of mechanism: a partition's batches reach its changelog in
transactions and are restored with ``read_committed`` (see
:mod:`streamapp.transports.kafka.transaction`).
Each batch writes every changed key of every table of the partition, the stream versions
it applied, and a checkpoint record (the source positions and the phase), so a restore
never applies part of a batch as if it were whole. Commit markers of our own were the
alternative; compaction removes old markers, so a restore could not tell a committed
batch from an abandoned one.

Since format 2, one changelog per agent holds all of the agent's tables, so one
partition's state (tables, per-stream versions, checkpoint) is one ordered log. Record
keys carry a one-byte tag so that compaction keeps each kind apart:
``b"d" + table + b"\\0" + key`` data (a null value deletes; ``table`` is its label,
``name@vN`` above version 1), ``b"v" + stream id`` the last applied stream version
(8 bytes, big-endian), ``b"h" + stream id`` a held stream (JSON, :mod:`.held`; a null
value releases it), ``b"s" + stream id + b"\\0" + event id`` a held event skipped for good
(JSON), ``b"e" + stream id + b"\\0" + stream version`` an event kept behind a held stream
(a null value: done with), ``b"c"`` the checkpoint (JSON).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from .checkpoint import Checkpoint
from .partition import (
    CHECKPOINT_KEY,
    HELD,
    KEPT,
    META,
    SKIPPED,
    VERSIONS,
    BatchChanges,
    PartitionTables,
    encode_version,
)

DATA = b"d"
VERSION = b"v"
HOLD = b"h"
SKIP = b"s"
KEEP = b"e"
CHECKPOINT = b"c"
SEP = b"\x00"


def records(batch: BatchChanges) -> Iterator[tuple[bytes, bytes | None]]:
    """The changelog records of ``batch``, checkpoint last."""
    for table, changes in batch.data.items():
        prefix = DATA + table.encode() + SEP
        for key, value in changes.items():
            yield prefix + key, value
    for sid, version in batch.versions.items():
        yield VERSION + sid, encode_version(version)
    for sid, held in batch.held.items():
        yield HOLD + sid, held
    for key, skip in batch.skipped.items():
        yield SKIP + key, skip
    for key, kept in batch.kept.items():
        yield KEEP + key, kept
    yield CHECKPOINT, batch.checkpoint.positions()


class ChangelogRecord(Protocol):
    """A changelog record as a restore reads it (an aiokafka record has these)."""

    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class RestoreChunk:
    """Changelog records turned into one atomic store write, plus the checkpoint they
    carry. Unknown tables and tags are counted, not applied (a table removed since)."""

    def __init__(self, tables: PartitionTables) -> None:
        self._spaces = {t.label.encode(): t.data_space for t in tables.tables}
        self.changes: dict[str, dict[bytes, bytes | None]] = {
            VERSIONS: {},
            HELD: {},
            SKIPPED: {},
            KEPT: {},
        }
        self.checkpoint: bytes | None = None
        self.checkpoint_offset = -1
        self.skipped = 0
        self.taken = 0
        """Records taken (applied or skipped)."""

    def apply(self, key: bytes | None, value: bytes | None, offset: int = -1) -> None:
        """Take the record at changelog ``offset``."""
        self.taken += 1
        key = key or b""
        tag = key[:1]
        if tag == DATA:
            table, _, rest = key[1:].partition(SEP)
            space = self._spaces.get(table)
            if space is None:
                self.skipped += 1
                return
            self.changes.setdefault(space, {})[rest] = value
        elif tag == VERSION:
            self.changes[VERSIONS][key[1:]] = value
        elif tag == HOLD:
            self.changes[HELD][key[1:]] = value
        elif tag == SKIP:
            self.changes[SKIPPED][key[1:]] = value
        elif tag == KEEP:
            self.changes[KEPT][key[1:]] = value
        elif tag == CHECKPOINT and value is not None:
            self.checkpoint, self.checkpoint_offset = value, offset
        else:
            self.skipped += 1

    def apply_records(self, records: Iterable[ChangelogRecord], start: int = 0) -> None:
        """Take every record of ``records`` at or after offset ``start`` (those below it
        are skipped: a fetch's first batch may begin before its offset), as :meth:`apply`
        takes one, in one loop."""
        versions, held = self.changes[VERSIONS], self.changes[HELD]
        spaces = self._spaces
        tables: dict[bytes, dict[bytes, bytes | None]] = {}
        taken = 0
        for rec in records:
            offset = rec.offset
            if offset < start:
                continue
            taken += 1
            key = rec.key or b""
            tag = key[:1]
            if tag == VERSION:
                versions[key[1:]] = rec.value
            elif tag == DATA:
                table, _, rest = key[1:].partition(SEP)
                changes = tables.get(table)
                if changes is None:
                    space = spaces.get(table)
                    if space is None:
                        self.skipped += 1
                        continue
                    changes = tables[table] = self.changes.setdefault(space, {})
                changes[rest] = rec.value
            elif tag == CHECKPOINT and rec.value is not None:
                self.checkpoint, self.checkpoint_offset = rec.value, offset
            elif tag == HOLD:
                held[key[1:]] = rec.value
            elif tag == SKIP:
                self.changes[SKIPPED][key[1:]] = rec.value
            elif tag == KEEP:
                self.changes[KEPT][key[1:]] = rec.value
            else:
                self.skipped += 1
        self.taken += taken

    def write(self, tables: PartitionTables, changelog: int) -> None:
        """Write the chunk with the checkpoint it reached (blocking, atomic)."""
        cp: Checkpoint = tables.checkpoint
        if self.checkpoint is not None:
            cp = cp.with_positions(self.checkpoint, self.checkpoint_offset)
        cp = cp.advanced(changelog=changelog)
        self.changes[META] = {CHECKPOINT_KEY: cp.encode()}
        tables.store.write(self.changes, keep=False)
        tables.checkpoint = cp
        if self.changes[HELD] or self.changes[SKIPPED]:
            tables.reload_held()
