"""The tables of one source partition: overlays, the stream-version guard, the checkpoint.

All tables of an agent for one partition share one Store, so a batch's changes to every
table, the per-stream versions (kept once per partition, in the ``versions`` space), the
held streams (``held``, :mod:`streamapp.tables.held`), the held events a release applies
from the lane's own copy (``held_events``) and the checkpoint land in one atomic write.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..topics import TopicSpec
from .base import Changes, Store
from .checkpoint import Checkpoint, new_mark
from .held import HeldStream
from .table import Table, TableView

META = "meta"
VERSIONS = "versions"
HELD = "held"
SKIPPED = "skipped"
KEPT = "held_events"
"""The versioned events parked behind a held stream, kept by stream and stream version
(``stream + b"\\0" + 8 bytes big-endian``), so that a release applies them right after
the held ones (:mod:`streamapp.engine.hold`)."""
CHECKPOINT_KEY = b"checkpoint"


def spaces_for(tables: Sequence[Table[Any]]) -> list[str]:
    """The store spaces a partition of these tables needs."""
    return [META, VERSIONS, HELD, SKIPPED, KEPT, *(t.data_space for t in tables)]


@dataclass(frozen=True, slots=True)
class BatchChanges:
    """What one batch changed: per table data, per stream versions, and the checkpoint
    that holds once it is written."""

    data: dict[str, dict[bytes, bytes | None]]
    versions: dict[bytes, int]
    checkpoint: Checkpoint
    held: dict[bytes, bytes | None] = field(default_factory=dict)
    """Held streams set (an encoded :class:`HeldStream`) or released (None)."""
    skipped: dict[bytes, bytes] = field(default_factory=dict)
    """Held events skipped for good (``streamapp parked skip``), by stream and event id."""
    kept: dict[bytes, bytes | None] = field(default_factory=dict)
    """Events parked behind a held stream kept (a delivery) or done with (None)."""

    @property
    def empty(self) -> bool:
        return (
            not self.versions
            and not self.held
            and not self.skipped
            and not self.kept
            and not any(self.data.values())
        )


def encode_version(version: int) -> bytes:
    return version.to_bytes(8, "big")


def decode_version(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


def kept_key(stream_id: str, version: int) -> bytes:
    """The key of stream ``stream_id``'s kept event of stream version ``version``."""
    return stream_id.encode() + b"\0" + encode_version(version)


class PartitionTables:
    """The agent's tables for one partition, as one unit of state.

    ``source`` is the topic the tables are partitioned like: with it, a write to a key
    that its partitioner puts on another partition raises
    :class:`~streamapp.errors.ForeignKeyError`.
    """

    def __init__(
        self,
        tables: Sequence[Table[Any]],
        store: Store,
        partition: int,
        source: TopicSpec | None = None,
        *,
        where: str = "",
    ) -> None:
        self.tables = list(tables)
        self.store = store
        self.partition = partition
        self.views: list[TableView[Any]] = [TableView(t, store, partition, source) for t in tables]
        self._views_by_label = {view.table.label: view for view in self.views}
        self.checkpoint = Checkpoint.decode(store.get(META, CHECKPOINT_KEY), where)
        self._vbatch: dict[str, int] = {}
        self._vevent: dict[str, int] = {}
        self._read_version = store.reader(VERSIONS)
        self._held: dict[str, HeldStream] = {}
        """The held streams as committed (a mirror of the ``held`` space)."""
        self._held_open: dict[str, HeldStream | None] = {}
        """Holds set (or released: None) in the open batch."""
        self._skipped_open: dict[bytes, bytes] = {}
        """Skips recorded in the open batch."""
        self._kept_open: dict[bytes, bytes | None] = {}
        """Held events kept (or done with: None) in the open batch."""
        self._skips = 0
        """The skips recorded here (committed): counted at open, then at each write."""
        self.reload_held()

    def applied_version(self, stream_id: str) -> int:
        """The last stream version applied for ``stream_id`` (0: none)."""
        version = self._vevent.get(stream_id)
        if version is None:
            version = self._vbatch.get(stream_id)
            if version is None:
                raw = self._read_version(stream_id.encode())
                return 0 if raw is None else int.from_bytes(raw, "big")
        return version

    def committed_version(self, stream_id: str) -> int:
        """The last stream version of ``stream_id`` in the store (the committed state
        views read; the open batch is not looked at). 0: none."""
        return decode_version(self.store.get(VERSIONS, stream_id.encode()))

    def record_version(self, stream_id: str, version: int) -> None:
        self._vevent[stream_id] = version

    # held streams (Park(destination, hold="stream")) ------------------------------------
    @property
    def holding(self) -> bool:
        """True when a stream is held here (open batch included): the cheap test a lane
        makes before it looks an event's stream up."""
        return bool(self._held) or bool(self._held_open)

    def held(self, stream_id: str) -> HeldStream | None:
        """The hold of ``stream_id``, open batch included (None: not held)."""
        if stream_id in self._held_open:
            return self._held_open[stream_id]
        return self._held.get(stream_id)

    def hold(self, held: HeldStream) -> None:
        """Hold (or update the hold of) ``held.stream`` in the open batch."""
        self._held_open[held.stream] = held

    def release(self, stream_id: str) -> None:
        """Release ``stream_id`` in the open batch."""
        self._held_open[stream_id] = None

    def skip(self, stream_id: str, event: str, record: bytes) -> None:
        """Record, in the open batch, that ``event`` of ``stream_id`` is skipped for good."""
        self._skipped_open[stream_id.encode() + b"\0" + event.encode()] = record

    def skipped(self, limit: int = 1000) -> list[bytes]:
        """The skips recorded here (committed), at most ``limit``."""
        return [raw for _, raw in self.store.scan(SKIPPED, None, limit)]

    @property
    def skips(self) -> int:
        """How many skips are recorded here (committed), kept in memory: what ``/status``
        shows without reading the ``skipped`` space."""
        return self._skips

    def keep(self, stream_id: str, version: int, record: bytes) -> None:
        """Keep, in the open batch, ``record``: the event of stream version ``version``
        parked behind the hold of ``stream_id``."""
        self._kept_open[kept_key(stream_id, version)] = record

    def done_with(self, stream_id: str, version: int) -> None:
        """Forget, in the open batch, the kept event of ``stream_id`` at ``version``."""
        self._kept_open[kept_key(stream_id, version)] = None

    def next_kept(self, stream_id: str, after: int) -> tuple[int, bytes] | None:
        """The kept event of ``stream_id`` with the lowest stream version above ``after``
        (open batch included), with its version; None: there is none."""
        prefix = stream_id.encode() + b"\0"
        low = kept_key(stream_id, after)
        opened = [
            k for k, raw in self._kept_open.items() if raw is not None and k.startswith(prefix)
        ]
        best = min((k for k in opened if k > low), default=None)
        cursor = low
        while (page := self.store.scan(KEPT, cursor, 16)) and (best is None or page[0][0] < best):
            fresh = [k for k, _ in page if k.startswith(prefix) and k not in self._kept_open]
            if fresh:
                best = fresh[0] if best is None else min(fresh[0], best)
                break
            if not page[-1][0].startswith(prefix):
                break
            cursor = page[-1][0]
        if best is None:
            return None
        raw = self._kept_open.get(best) or self.store.get(KEPT, best)
        assert raw is not None
        return decode_version(best[len(prefix) :]), raw

    def held_streams(self) -> dict[str, HeldStream]:
        """The committed held streams (what views and status report)."""
        return dict(self._held)

    def committed_held(self, stream_id: str) -> HeldStream | None:
        """The committed hold of ``stream_id`` (None: not held)."""
        return self._held.get(stream_id)

    def reload_held(self) -> None:
        """Read the held streams again from the store (after a restore or a wipe)."""
        held: dict[str, HeldStream] = {}
        after: bytes | None = None
        while page := self.store.scan(HELD, after, 1000):
            for key, raw in page:
                held[key.decode()] = HeldStream.decode(raw)
            after = page[-1][0]
        self._held, self._held_open = held, {}
        self._skips = self._count(SKIPPED)

    def _count(self, space: str) -> int:
        """The keys of ``space`` (read in pages: the skips are few)."""
        n, after = 0, None
        while page := self.store.scan(space, after, 1000):
            n, after = n + len(page), page[-1][0]
        return n

    def wipe(self) -> None:
        """Empty the store (every space) and forget its checkpoint and holds."""
        self.store.wipe()
        self.checkpoint = Checkpoint()
        self._held, self._held_open, self._kept_open, self._skips = {}, {}, {}, 0

    def view(self, table: str) -> TableView[Any]:
        """This partition's view of the table labelled ``table`` (``Table.label``)."""
        return self._views_by_label[table]

    def commit_event(self, stream_id: str | None = None, version: int | None = None) -> None:
        """Keep the current event's writes in the open batch; with ``stream_id`` and
        ``version``, record that version as applied too (:meth:`record_version` and this
        in one call, the runner's per event)."""
        for view in self.views:
            view.commit_event()
        if self._vevent:
            self._vbatch.update(self._vevent)
            self._vevent.clear()
        if version is not None and stream_id is not None:
            self._vbatch[stream_id] = version

    def rollback_event(self) -> None:
        for view in self.views:
            view.rollback_event()
        self._vevent.clear()

    def take_batch(self, checkpoint: Checkpoint) -> BatchChanges:
        """The open batch's changes, to hold with ``checkpoint`` under a fresh mark (the
        overlays are emptied)."""
        versions = {sid.encode(): version for sid, version in self._vbatch.items()}
        self._vbatch = {}
        data = {view.table.label: view.take_batch() for view in self.views}
        held = {
            sid.encode(): None if h is None else h.encode() for sid, h in self._held_open.items()
        }
        skipped, self._held_open, self._skipped_open = self._skipped_open, {}, {}
        kept, self._kept_open = self._kept_open, {}
        checkpoint = checkpoint.advanced(mark=new_mark())
        return BatchChanges(
            data=data,
            versions=versions,
            checkpoint=checkpoint,
            held=held,
            skipped=skipped,
            kept=kept,
        )

    def drop_batch(self) -> None:
        """Forget the open batch (a failed flush, or a failed event's leftovers)."""
        self._vbatch.clear()
        self._vevent.clear()
        self._held_open, self._skipped_open, self._kept_open = {}, {}, {}
        for view in self.views:
            view.take_batch()
            view.rollback_event()

    def store_changes(self, batch: BatchChanges, checkpoint: Checkpoint) -> Changes:
        """The atomic store write for ``batch`` with ``checkpoint``."""
        changes: dict[str, dict[bytes, bytes | None]] = {
            table.data_space: batch.data.get(table.label, {}) for table in self.tables
        }
        changes[VERSIONS] = {k: encode_version(v) for k, v in batch.versions.items()}
        if batch.held:
            changes[HELD] = batch.held
        if batch.skipped:
            changes[SKIPPED] = dict(batch.skipped)
        if batch.kept:
            changes[KEPT] = dict(batch.kept)
        changes[META] = {CHECKPOINT_KEY: checkpoint.encode()}
        return changes

    def write(self, batch: BatchChanges, changelog: int | None = None) -> None:
        """Write ``batch`` and its checkpoint in one atomic store write (blocking).

        ``changelog`` is the next changelog offset once the batch is in the changelog:
        its checkpoint record, the batch's last, is at ``changelog - 1``. Without it the
        store keeps the mark of the last batch that reached a changelog.
        """
        now = int(time.time() * 1000)
        if changelog is None:
            cp = self.checkpoint
            checkpoint = batch.checkpoint.advanced(
                changelog=cp.changelog, written_ms=now, mark=cp.mark, marked=cp.marked
            )
        else:
            checkpoint = batch.checkpoint.advanced(
                changelog=changelog, written_ms=now, marked=changelog - 1
            )
        new_skips = sum(self.store.get(SKIPPED, key) is None for key in batch.skipped)
        self.store.write(self.store_changes(batch, checkpoint))
        self.checkpoint = checkpoint
        self._skips += new_skips
        for sid, raw in batch.held.items():
            if raw is None:
                self._held.pop(sid.decode(), None)
            else:
                self._held[sid.decode()] = HeldStream.decode(raw)
