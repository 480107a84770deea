"""A restore's own read of a changelog: which record batches of a ``read_committed`` fetch
are applied (aborted transactions and control batches never), and a chunk taking whole
batches at once as record by record."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
from aiokafka.record.control_record import ABORT_MARKER, COMMIT_MARKER, ControlRecord

from streamapp import Table
from streamapp.tables import changelog
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.transports.kafka.changelog_read import Batch, committed_batches

TABLE: Table[str] = Table("status")


@dataclass
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class FakeBatch:
    """An aiokafka record batch as far as the restore reads it."""

    base_offset: int
    records: list[Rec]
    producer_id: int | None = None
    is_transactional: bool = False
    is_control_batch: bool = False
    next_offset: int = field(init=False)

    def __post_init__(self) -> None:
        self.next_offset = self.base_offset + len(self.records)

    def __iter__(self) -> Iterator[Rec]:
        return iter(self.records)


def _marker(offset: int, producer: int, marker: ControlRecord) -> FakeBatch:
    key = marker.version.to_bytes(2, "big") + marker.type_.to_bytes(2, "big")
    return FakeBatch(offset, [Rec(offset, key, b"")], producer, True, True)


def _txn(offset: int, producer: int, *values: str) -> FakeBatch:
    records = [
        Rec(offset + i, b"dstatus\x00" + v.encode(), orjson.dumps(v)) for i, v in enumerate(values)
    ]
    return FakeBatch(offset, records, producer, True)


def _kept(batches: list[FakeBatch], aborted: list[tuple[int, int]]) -> list[int | None]:
    fetched: list[Batch] = list(batches)
    return [None if b is None else b.base_offset for b, _ in committed_batches(fetched, aborted)]


def test_an_aborted_transaction_between_committed_ones_is_left_out() -> None:
    batches = [
        _txn(0, 1, "a", "b"),
        _marker(2, 1, COMMIT_MARKER),
        _txn(3, 2, "x"),  # producer 2's transaction, aborted
        _txn(4, 1, "c"),  # producer 1's, interleaved, committed
        _marker(5, 2, ABORT_MARKER),
        _marker(6, 1, COMMIT_MARKER),
        _txn(7, 2, "d"),  # producer 2 again, after its abort: committed
        _marker(8, 2, COMMIT_MARKER),
    ]
    assert _kept(batches, [(2, 3)]) == [0, None, None, 4, None, None, 7, None]
    nexts = [after for _, after in committed_batches(list(batches), [(2, 3)])]
    assert nexts == [2, 3, 4, 5, 6, 7, 8, 9]  # the position moves past what is left out


def test_an_aborted_transaction_that_began_in_an_earlier_fetch_stays_out() -> None:
    """The broker lists an aborted transaction by its first offset, which may lie
    before the fetch: every batch of that producer up to its abort marker is out."""
    batches = [_txn(10, 3, "y"), _marker(11, 3, ABORT_MARKER), _txn(12, 4, "z")]
    assert _kept(batches, [(3, 7)]) == [None, None, 12]


def test_a_restore_chunk_spanning_an_aborted_transaction_applies_only_committed_records() -> None:
    pt = PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0)
    batches = [
        _txn(0, 1, "a"),
        _txn(1, 2, "a-aborted", "b-aborted"),
        _marker(3, 2, ABORT_MARKER),
        FakeBatch(
            4,
            [Rec(4, b"vs1", (7).to_bytes(8, "big")), Rec(5, b"c", Checkpoint(live=9).positions())],
            1,
            True,
        ),
        _marker(6, 1, COMMIT_MARKER),
    ]
    chunk = changelog.RestoreChunk(pt)
    end = 0
    for batch, after in committed_batches(list(batches), [(2, 1)]):
        if batch is not None:
            chunk.apply_records(batch)
        end = after
    chunk.write(pt, end)
    assert dict(pt.views[0].items()) == {"a": "a"}
    assert pt.applied_version("s1") == 7
    assert (pt.checkpoint.live, pt.checkpoint.changelog, pt.checkpoint.marked) == (9, 7, 5)
    assert chunk.taken == 3


def test_apply_records_takes_a_batch_as_apply_takes_each_record() -> None:
    """Same changes, checkpoint, skips and count; records below the start are skipped
    (a fetch's first batch may begin before the fetched offset)."""
    recs = [
        Rec(0, b"dstatus\x00k", orjson.dumps("old")),
        Rec(1, b"dstatus\x00k", orjson.dumps("new")),
        Rec(2, b"dgone\x00k", b"1"),  # a table removed since
        Rec(3, b"vk", (2).to_bytes(8, "big")),
        Rec(4, b"dstatus\x00del", None),
        Rec(5, b"?", b"unknown tag"),
        Rec(6, b"c", Checkpoint(live=4, mark="cd" * 8).positions()),
    ]
    one = changelog.RestoreChunk(PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0))
    for rec in recs[1:]:
        one.apply(rec.key, rec.value, rec.offset)
    batch = changelog.RestoreChunk(PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0))
    batch.apply_records(recs, 1)
    assert batch.changes == one.changes
    assert (batch.checkpoint, batch.checkpoint_offset) == (one.checkpoint, one.checkpoint_offset)
    assert (batch.skipped, batch.taken) == (one.skipped, one.taken) == (2, 6)
