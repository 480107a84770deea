"""Table overlays, the stream-version guard state and the checkpoint, over a MemoryStore."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streamapp import Table
from streamapp.errors import ForeignKeyError, StoreFormatError
from streamapp.tables import changelog
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import (
    CHECKPOINT_KEY,
    META,
    PartitionTables,
    decode_version,
    encode_version,
    spaces_for,
)
from streamapp.tables.store import MemoryStore
from streamapp.topics import TopicSpec, partition_for


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
    pt.write(pt.take_batch(Checkpoint(live=offset)))


def test_spaces_for() -> None:
    assert spaces_for([Table("a"), Table("b")]) == [
        "meta",
        "versions",
        "held",
        "skipped",
        "held_events",
        "t:a",
        "t:b",
    ]


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
    batch = pt.take_batch(Checkpoint(live=5))
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

    batch = pt.take_batch(Checkpoint(live=11))
    assert batch.checkpoint == Checkpoint(live=11, mark=batch.checkpoint.mark)
    assert len(batch.checkpoint.mark) == 16
    assert batch.data == {
        "status": {b"a": orjson.dumps({"n": 1}), b"gone": None},
        "totals": {b"t": orjson.dumps(5)},
    }
    assert batch.versions == {b"a": 3}
    assert not batch.empty

    again = pt.take_batch(Checkpoint(live=12))
    assert again.empty
    assert again.data == {"status": {}, "totals": {}}
    assert again.versions == {}
    assert status.get("a") is None  # nothing was written to the store


def test_empty_batch() -> None:
    pt = PartitionTables([Table("x")], MemoryStore(spaces_for([Table("x")])), 0)
    assert pt.take_batch(Checkpoint(live=0)).empty


def test_later_event_overrides_earlier_in_batch(pt: PartitionTables) -> None:
    status = pt.views[0]
    status["k"] = 1
    pt.record_version("k", 1)
    pt.commit_event()
    status["k"] = 2
    pt.record_version("k", 2)
    pt.commit_event()
    batch = pt.take_batch(Checkpoint(live=2))
    assert batch.data["status"] == {b"k": orjson.dumps(2)}
    assert batch.versions == {b"k": 2}


def test_checkpoint_encode_decode() -> None:
    assert Checkpoint.decode(None) == Checkpoint()
    assert Checkpoint().live is None
    cp = Checkpoint(live=42, history=7, caught_up=True, changelog=9, written_ms=5)
    assert Checkpoint.decode(cp.encode()) == cp
    assert orjson.loads(cp.encode())["format"] == 2
    assert orjson.loads(cp.positions()) == {"live": 42, "history": 7, "caught_up": True}
    assert Checkpoint(changelog=3).with_positions(cp.positions()) == Checkpoint(
        live=42, history=7, caught_up=True, changelog=3
    )


def test_each_batch_has_its_own_mark_and_the_store_remembers_its_changelog_record(
    pt: PartitionTables, store: MemoryStore
) -> None:
    first = pt.take_batch(Checkpoint(live=1))
    second = pt.take_batch(Checkpoint(live=1))
    assert first.checkpoint.mark != second.checkpoint.mark
    assert orjson.loads(first.checkpoint.positions())["mark"] == first.checkpoint.mark
    pt.write(first, changelog=12)  # records 0..11, the checkpoint record last
    assert (pt.checkpoint.mark, pt.checkpoint.marked) == (first.checkpoint.mark, 11)
    pt.write(second)  # no changelog: the lineage stays that of the last changelog batch
    assert (pt.checkpoint.mark, pt.checkpoint.marked) == (first.checkpoint.mark, 11)
    assert Checkpoint.decode(store.get(META, CHECKPOINT_KEY)) == pt.checkpoint


def test_restore_chunk_takes_the_mark_and_offset_of_the_checkpoint_record(
    pt: PartitionTables,
) -> None:
    chunk = changelog.RestoreChunk(pt)
    chunk.apply(b"dstatus\x00k", orjson.dumps("v"), 40)
    chunk.apply(b"c", Checkpoint(live=3, mark="ab" * 8).positions(), 41)
    chunk.write(pt, 43)
    cp = pt.checkpoint
    assert (cp.live, cp.changelog, cp.mark, cp.marked) == (3, 43, "ab" * 8, 41)


def test_checkpoint_of_an_older_layout_is_refused_clearly() -> None:
    with pytest.raises(StoreFormatError, match=r"format 1.*Remove the store"):
        Checkpoint.decode(b'{"offset": 3, "changelog": {"status": 2}}', "orders[3]")


def test_version_encoding() -> None:
    assert encode_version(1) == b"\x00" * 7 + b"\x01"
    assert encode_version(2**40 + 5) == (2**40 + 5).to_bytes(8, "big")
    assert decode_version(encode_version(123456789)) == 123456789
    assert decode_version(None) == 0
    # big-endian: byte order is numeric order
    assert sorted([encode_version(v) for v in (300, 2, 70000)]) == [
        encode_version(v) for v in (2, 300, 70000)
    ]


def test_store_changes_one_write_with_data_versions_once_and_checkpoint(
    pt: PartitionTables,
) -> None:
    status, totals = pt.views
    status["o-1"] = "paid"
    del totals["o-2"]
    pt.record_version("o-1", 258)
    pt.commit_event()
    batch = pt.take_batch(Checkpoint(live=9))
    cp = batch.checkpoint.advanced(changelog=4)
    changes = pt.store_changes(batch, cp)
    assert set(changes) == {"meta", "versions", "t:status", "t:totals"}
    assert changes["t:status"] == {b"o-1": orjson.dumps("paid")}
    assert changes["t:totals"] == {b"o-2": None}
    assert changes["versions"] == {b"o-1": b"\x00\x00\x00\x00\x00\x00\x01\x02"}
    assert changes[META] == {CHECKPOINT_KEY: cp.encode()}


def test_write_persists_checkpoint_and_a_new_partition_reads_it(
    tables: tuple[Table[Any], Table[Any]], pt: PartitionTables, store: MemoryStore
) -> None:
    pt.views[0]["k"] = "v"
    pt.record_version("k", 2)
    pt.commit_event()
    pt.write(pt.take_batch(Checkpoint(live=17, history=4)), changelog=3)
    cp = pt.checkpoint
    assert (cp.live, cp.history, cp.changelog) == (17, 4, 3)
    assert cp.written_ms > 0
    assert Checkpoint.decode(store.get(META, CHECKPOINT_KEY)) == cp
    reopened = PartitionTables(tables, store, partition=3)
    assert reopened.checkpoint == cp
    assert reopened.applied_version("k") == 2
    assert reopened.views[0]["k"] == "v"


def test_applied_version_reads_event_then_batch_then_store(
    pt: PartitionTables, store: MemoryStore
) -> None:
    assert pt.applied_version("s") == 0
    pt.record_version("s", 3)
    pt.commit_event()
    flush(pt, 1)
    assert store.get("versions", b"s") == encode_version(3)
    assert pt.applied_version("s") == 3
    pt.record_version("s", 4)
    pt.commit_event()
    assert pt.applied_version("s") == 4  # batch overlay
    pt.record_version("s", 5)
    assert pt.applied_version("s") == 5  # event overlay
    pt.rollback_event()
    assert pt.applied_version("s") == 4
    pt.drop_batch()  # dropped without write: back to the store
    assert pt.applied_version("s") == 3


def test_partition_without_tables() -> None:
    pt = PartitionTables([], MemoryStore(spaces_for([])), 0)
    assert pt.views == []
    assert pt.applied_version("s") == 0
    cp = Checkpoint(live=1)
    assert pt.store_changes(pt.take_batch(cp), cp) == {
        "versions": {},
        META: {CHECKPOINT_KEY: cp.encode()},
    }


def test_write_to_a_key_of_another_partition_is_a_clear_error() -> None:
    status = Table("status")
    own = partition_for(b"o-1", 8)
    pt = PartitionTables([status], MemoryStore(spaces_for([status])), own, TopicSpec("o", 8))
    view = pt.views[0]
    view["o-1"] = "mine"
    other = next(k for k in (f"c-{i}" for i in range(100)) if partition_for(k.encode(), 8) != own)
    with pytest.raises(ForeignKeyError) as err:
        view[other] = "not mine"
    message = str(err.value)
    assert "'status'" in message
    assert repr(other) in message
    assert f"partition {partition_for(other.encode(), 8)}" in message
    assert f"partition {own}" in message
    with pytest.raises(ForeignKeyError):
        del view[other]
    assert view.get("o-1") == "mine"


def test_changelog_records_restore_into_an_empty_partition(
    tables: tuple[Table[Any], Table[Any]], pt: PartitionTables
) -> None:
    status, totals = pt.views
    status["a"] = "paid"
    totals["a"] = 3
    del status["gone"]
    pt.record_version("a", 5)
    pt.commit_event()
    batch = pt.take_batch(Checkpoint(live=40, history=12, caught_up=True))
    recs = list(changelog.records(batch))
    assert recs[-1][0] == changelog.CHECKPOINT

    fresh = PartitionTables(tables, MemoryStore(spaces_for(tables)), 3)
    chunk = changelog.RestoreChunk(fresh)
    for key, value in recs:
        chunk.apply(key, value)
    chunk.apply(b"d" + b"dropped_table\x00k", b"1")
    chunk.write(fresh, changelog=len(recs))
    assert chunk.skipped == 1
    assert fresh.views[0]["a"] == "paid"
    assert fresh.views[1]["a"] == 3
    assert fresh.applied_version("a") == 5
    cp = fresh.checkpoint
    assert (cp.live, cp.history, cp.caught_up, cp.changelog) == (40, 12, True, len(recs))


def test_rollback_undoes_every_write_of_the_event_in_reverse(pt: PartitionTables) -> None:
    """Several writes and a delete of one key in a failed event: the batch's value of
    before the event comes back; a key the event created and deleted stays absent."""
    status = pt.views[0]
    status["a"] = "batch"
    pt.commit_event()
    status["a"] = "one"
    status["a"] = "two"
    del status["a"]
    status["new"] = "x"
    del status["new"]
    status["new2"] = "y"
    assert "a" not in status
    pt.rollback_event()
    assert status["a"] == "batch"
    assert "new" not in status
    assert "new2" not in status
    assert pt.take_batch(Checkpoint(live=1)).data["status"] == {b"a": orjson.dumps("batch")}


def test_an_event_open_across_take_batch_stays_open_and_can_roll_back(
    pt: PartitionTables, store: MemoryStore
) -> None:
    status = pt.views[0]
    status["a"] = "committed"
    pt.commit_event()
    status["a"] = "open"
    status["b"] = "open"
    batch = pt.take_batch(Checkpoint(live=1))
    assert batch.data["status"] == {b"a": orjson.dumps("committed")}
    pt.write(batch)
    assert status["a"] == "open"
    pt.rollback_event()
    assert status["a"] == "committed"  # from the store now
    assert "b" not in status
    assert pt.take_batch(Checkpoint(live=2)).empty
