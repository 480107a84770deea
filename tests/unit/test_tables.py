"""Table overlays, the stream-version guard state and the checkpoint, over a MemoryStore."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streamapp import Table
from streamapp.tables.partition import (
    CHECKPOINT_KEY,
    META,
    Checkpoint,
    PartitionTables,
    decode_version,
    encode_version,
    spaces_for,
)
from streamapp.tables.store import MemoryStore


@pytest.fixture
def tables() -> tuple[Table[Any], Table[Any]]:
    return Table("status"), Table("totals")


@pytest.fixture
def store(tables: tuple[Table[Any], Table[Any]]) -> MemoryStore:
    return MemoryStore(spaces_for(tables))


@pytest.fixture
def pt(tables: tuple[Table[Any], Table[Any]], store: MemoryStore) -> PartitionTables:
    return PartitionTables(tables, store, partition=3)


def flush(pt: PartitionTables, offset: int) -> None:
    pt.write(pt.take_batch(offset), pt.checkpoint.advanced(offset, {}))


def test_spaces_for() -> None:
    assert spaces_for([Table("a"), Table("b")]) == ["meta", "t:a", "v:a", "t:b", "v:b"]


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x:y"])
def test_bad_table_names(name: str) -> None:
    with pytest.raises(ValueError, match="table name"):
        Table(name)


def test_writes_visible_in_event_and_batch_not_in_store_until_write(
    pt: PartitionTables, store: MemoryStore
) -> None:
    status, totals = pt.views
    assert status.partition == 3
    status["o-1"] = {"status": "placed"}
    totals["o-1"] = 10
    assert status["o-1"] == {"status": "placed"}
    assert status.get("o-1") == {"status": "placed"}
    assert "o-1" in status
    assert totals["o-1"] == 10
    assert store.get("t:status", b"o-1") is None
    pt.commit_event()
    assert status["o-1"] == {"status": "placed"}
    assert store.get("t:status", b"o-1") is None
    assert list(status.items()) == []  # items() is committed state only
    flush(pt, 1)
    assert orjson.loads(store.get("t:status", b"o-1") or b"") == {"status": "placed"}
    assert orjson.loads(store.get("t:totals", b"o-1") or b"") == 10
    assert list(status.items()) == [("o-1", {"status": "placed"})]
    assert status["o-1"] == {"status": "placed"}


def test_missing_key(pt: PartitionTables) -> None:
    status = pt.views[0]
    assert status.get("nope") is None
    assert status.get("nope", "dflt") == "dflt"
    assert "nope" not in status
    assert 42 not in status
    with pytest.raises(KeyError):
        status["nope"]


def test_tables_are_separate(pt: PartitionTables) -> None:
    status, totals = pt.views
    status["k"] = "s"
    assert totals.get("k") is None


def test_delete_shadows_store_value(pt: PartitionTables, store: MemoryStore) -> None:
    status = pt.views[0]
    status["k"] = 1
    pt.commit_event()
    flush(pt, 1)
    del status["k"]
    assert "k" not in status
    assert status.get("k") is None
    assert store.get("t:status", b"k") is not None
    pt.commit_event()
    assert "k" not in status
    flush(pt, 2)
    assert store.get("t:status", b"k") is None


def test_rollback_event_discards_only_current_event(pt: PartitionTables) -> None:
    status, totals = pt.views
    status["a"] = "first"
    pt.record_version("a", 1)
    pt.commit_event()

    status["a"] = "second"
    status["b"] = "new"
    totals["a"] = 99
    pt.record_version("a", 2)
    pt.record_version("b", 1)
    assert status["a"] == "second"
    assert pt.applied_version("a") == 2
    pt.rollback_event()

    assert status["a"] == "first"
    assert "b" not in status
    assert "a" not in totals
    assert pt.applied_version("a") == 1
    assert pt.applied_version("b") == 0
    batch = pt.take_batch(5)
    assert batch.data == {"status": {b"a": orjson.dumps("first")}, "totals": {}}
    assert batch.versions == {b"a": 1}


def test_rollback_event_does_not_touch_store(pt: PartitionTables, store: MemoryStore) -> None:
    status = pt.views[0]
    status["a"] = "kept"
    pt.record_version("a", 4)
    pt.commit_event()
    flush(pt, 1)
    status["a"] = "dropped"
    pt.record_version("a", 5)
    pt.rollback_event()
    assert status["a"] == "kept"
    assert pt.applied_version("a") == 4


def test_take_batch_returns_changes_and_empties_overlays(pt: PartitionTables) -> None:
    status, totals = pt.views
    status["a"] = {"n": 1}
    del status["gone"]
    totals["t"] = 5
    pt.record_version("a", 3)
    pt.commit_event()
    status["uncommitted"] = 1  # an event still open is not part of the batch

    batch = pt.take_batch(11)
    assert batch.offset == 11
    assert batch.data == {
        "status": {b"a": orjson.dumps({"n": 1}), b"gone": None},
        "totals": {b"t": orjson.dumps(5)},
    }
    assert batch.versions == {b"a": 3}
    assert not batch.empty

    again = pt.take_batch(12)
    assert again.empty
    assert again.data == {"status": {}, "totals": {}}
    assert again.versions == {}
    assert status.get("a") is None  # nothing was written to the store


def test_empty_batch() -> None:
    pt = PartitionTables([Table("x")], MemoryStore(spaces_for([Table("x")])), 0)
    assert pt.take_batch(0).empty


def test_later_event_overrides_earlier_in_batch(pt: PartitionTables) -> None:
    status = pt.views[0]
    status["k"] = 1
    pt.record_version("k", 1)
    pt.commit_event()
    status["k"] = 2
    pt.record_version("k", 2)
    pt.commit_event()
    batch = pt.take_batch(2)
    assert batch.data["status"] == {b"k": orjson.dumps(2)}
    assert batch.versions == {b"k": 2}


def test_checkpoint_encode_decode() -> None:
    assert Checkpoint.decode(None) == Checkpoint()
    assert Checkpoint().offset is None
    cp = Checkpoint(offset=42, changelog={"status": 7}, seen={"status": 40})
    assert Checkpoint.decode(cp.encode()) == cp
    assert orjson.loads(cp.encode()) == {
        "offset": 42,
        "changelog": {"status": 7},
        "seen": {"status": 40},
    }
    assert Checkpoint.decode(b'{"offset": 3}') == Checkpoint(offset=3)


def test_checkpoint_advanced() -> None:
    cp = Checkpoint(offset=3, changelog={"b": 2}, seen={"b": 1})
    nxt = cp.advanced(10, {"a": 5})
    assert nxt.offset == 10
    assert nxt.changelog == {"b": 2, "a": 5}
    assert nxt.seen == {"a": 10, "b": 10}
    assert cp == Checkpoint(offset=3, changelog={"b": 2}, seen={"b": 1})  # unchanged
    assert cp.advanced(11, {"b": 9}).changelog == {"b": 9}


def test_version_encoding() -> None:
    assert encode_version(1) == b"\x00" * 7 + b"\x01"
    assert encode_version(2**40 + 5) == (2**40 + 5).to_bytes(8, "big")
    assert decode_version(encode_version(123456789)) == 123456789
    assert decode_version(None) == 0
    # big-endian: byte order is numeric order
    assert sorted([encode_version(v) for v in (300, 2, 70000)]) == [
        encode_version(v) for v in (2, 300, 70000)
    ]


def test_store_changes_one_write_with_data_versions_and_checkpoint(
    pt: PartitionTables,
) -> None:
    status, totals = pt.views
    status["o-1"] = "paid"
    del totals["o-2"]
    pt.record_version("o-1", 258)
    pt.commit_event()
    batch = pt.take_batch(9)
    cp = pt.checkpoint.advanced(9, {"status": 4})
    changes = pt.store_changes(batch, cp)
    assert set(changes) == {"meta", "t:status", "v:status", "t:totals", "v:totals"}
    assert changes["t:status"] == {b"o-1": orjson.dumps("paid")}
    assert changes["t:totals"] == {b"o-2": None}
    assert changes["v:status"] == {b"o-1": b"\x00\x00\x00\x00\x00\x00\x01\x02"}
    assert changes["v:totals"] == {b"o-1": b"\x00\x00\x00\x00\x00\x00\x01\x02"}
    assert changes[META] == {CHECKPOINT_KEY: cp.encode()}


def test_write_persists_checkpoint_and_a_new_partition_reads_it(
    tables: tuple[Table[Any], Table[Any]], pt: PartitionTables, store: MemoryStore
) -> None:
    pt.views[0]["k"] = "v"
    pt.record_version("k", 2)
    pt.commit_event()
    cp = pt.checkpoint.advanced(17, {"status": 3})
    pt.write(pt.take_batch(17), cp)
    assert pt.checkpoint == cp
    assert Checkpoint.decode(store.get(META, CHECKPOINT_KEY)) == cp
    reopened = PartitionTables(tables, store, partition=3)
    assert reopened.checkpoint == cp
    assert reopened.checkpoint.offset == 17
    assert reopened.applied_version("k") == 2
    assert reopened.views[0]["k"] == "v"


def test_applied_version_reads_event_then_batch_then_store(
    pt: PartitionTables, store: MemoryStore
) -> None:
    assert pt.applied_version("s") == 0
    pt.record_version("s", 3)
    pt.commit_event()
    flush(pt, 1)
    assert store.get("v:status", b"s") == encode_version(3)
    assert pt.applied_version("s") == 3
    pt.record_version("s", 4)
    pt.commit_event()
    assert pt.applied_version("s") == 4  # batch overlay
    pt.record_version("s", 5)
    assert pt.applied_version("s") == 5  # event overlay
    pt.rollback_event()
    assert pt.applied_version("s") == 4
    pt.take_batch(2)  # dropped without write: back to the store
    assert pt.applied_version("s") == 3


def test_partition_without_tables() -> None:
    pt = PartitionTables([], MemoryStore(spaces_for([])), 0)
    assert pt.views == []
    assert pt.applied_version("s") == 0
    assert pt.store_changes(pt.take_batch(1), Checkpoint(offset=1)) == {
        META: {CHECKPOINT_KEY: Checkpoint(offset=1).encode()}
    }
