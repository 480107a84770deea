"""RocksDB's statuses classified on real rocksdict errors: damaged stores made in tmp_path
(bit rot in data blocks, files cut to half, a damaged index), a LOCK held by another
process; a corrupt read is remembered and told, and is never an agent's failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamapp import App, Event, Park, Table, TableView
from streamapp.agents.agent import handle
from streamapp.errors import StoreCorruptError, StoreError, StoreIOError, StoreLockedError
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.rocksdb.status_codes import status_of, store_error
from streamapp.tables.store import RocksStore, discard

TABLE: Table[dict[str, int]] = Table("rows")
SPACES = spaces_for([TABLE])
KEYS = [f"key-{i:05d}" for i in range(3000)]


def _store_with_ssts(path: Path) -> None:
    """A store whose data is in SST files (every column family flushed)."""
    store = RocksStore(path, SPACES, open_timeout_s=1)
    for i in range(0, len(KEYS), 500):
        chunk = KEYS[i : i + 500]
        store.write(
            {
                TABLE.data_space: {
                    k.encode(): b'{"n":%d,"pad":"%s"}' % (n, b"x" * 40) for n, k in enumerate(chunk)
                },
                "versions": {k.encode(): (1).to_bytes(8, "big") for k in chunk},
                "meta": {b"checkpoint": b'{"format":2}'},
            }
        )
    for family in store._cfs.values():
        family.flush()
    store.close()


def _data_ssts(path: Path) -> list[Path]:
    """SST files of the data spaces (the meta space's one file holds the checkpoint)."""
    files = [f for f in path.glob("*.sst") if b"checkpoint" not in f.read_bytes()]
    assert files, f"no data SST files in {path}"
    return files


def _flip(path: Path, offsets: range) -> None:
    with path.open("r+b") as f:
        for offset in offsets:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))


def _rot_data_blocks(path: Path) -> None:
    for sst in _data_ssts(path):
        size = sst.stat().st_size
        _flip(sst, range(size // 8, size // 2, 256))


def _cut_to_half(path: Path) -> None:
    for sst in path.glob("*.sst"):
        os.truncate(sst, sst.stat().st_size // 2)


def _damage_index(path: Path) -> None:
    for sst in _data_ssts(path):
        size = sst.stat().st_size
        _flip(sst, range(size - 200, size - 100, 7))


def test_bit_rot_in_data_blocks_opens_then_every_read_of_it_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _store_with_ssts(path)
    _rot_data_blocks(path)
    store = RocksStore(path, SPACES, open_timeout_s=1)
    told: list[StoreCorruptError] = []
    store.watch(told.append)
    try:
        errors: list[StoreCorruptError] = []
        for key in KEYS:
            try:
                store.get(TABLE.data_space, key.encode())
            except StoreCorruptError as exc:
                errors.append(exc)
        assert errors, "the damage hit no data block"
        first = errors[0]
        assert first.status.startswith("Corruption: block checksum mismatch")
        assert first.path == str(path)
        assert str(path) in str(first)
        assert not first.retriable
        assert len(told) == 1  # told once
        assert told[0].status == first.status
        # From the first damage on, nothing is served: not a cached key, not a write.
        with pytest.raises(StoreCorruptError):
            store.get(TABLE.data_space, KEYS[0].encode())
        with pytest.raises(StoreCorruptError):
            store.scan(TABLE.data_space, None, 10)
        with pytest.raises(StoreCorruptError):
            store.write({"meta": {b"checkpoint": b"{}"}})
    finally:
        store.close()
    discard(str(path))
    assert not path.exists()
    RocksStore(path, SPACES, open_timeout_s=1).close()  # opens empty after the discard


def test_a_scan_over_rotten_blocks_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _store_with_ssts(path)
    _rot_data_blocks(path)
    store = RocksStore(path, SPACES, open_timeout_s=1)
    try:
        with pytest.raises(StoreCorruptError, match="block checksum mismatch"):
            store.scan(TABLE.data_space, None, len(KEYS))
    finally:
        store.close()


def test_files_cut_to_half_are_corrupt_at_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _store_with_ssts(path)
    _cut_to_half(path)
    with pytest.raises(StoreCorruptError) as info:
        RocksStore(path, SPACES, open_timeout_s=5)
    assert info.value.status.startswith("Corruption: Sst file size mismatch")
    assert info.value.path == str(path)


def test_a_damaged_index_is_corrupt_at_open_at_once_not_locked(tmp_path: Path) -> None:
    """ "block checksum mismatch" contains "lock": it was reported as a held LOCK, after
    the whole open timeout."""
    path = tmp_path / "db"
    _store_with_ssts(path)
    _damage_index(path)
    with pytest.raises(StoreCorruptError) as info:  # a lock would be StoreLockedError
        RocksStore(path, SPACES, open_timeout_s=5)
    assert info.value.status.startswith("Corruption:")
    assert not isinstance(info.value, StoreLockedError)


def test_a_lock_held_by_another_process_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksStore(path, SPACES, open_timeout_s=1)
    store.write({space: {b"k": b"v"} for space in SPACES})  # spaces nothing wrote are dropped
    store.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from rocksdict import Rdict, Options;"
            f"d = Rdict({str(path)!r}, Options(raw_mode=True), column_families="
            f"{{n: Options(raw_mode=True) for n in {SPACES!r}}});"
            "print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(StoreLockedError) as info:
            RocksStore(path, SPACES, open_timeout_s=0.3)
        assert info.value.status.startswith("IO error: While lock file:")
        assert info.value.status.endswith("LOCK: Resource temporarily unavailable")
        assert info.value.retriable
        with pytest.raises(StoreLockedError):
            discard(str(path))  # RocksDB's destroy takes the LOCK first: nothing removed
        assert (path / "CURRENT").exists()
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_statuses_are_classified_by_their_code_prefix() -> None:
    corrupt = store_error(Exception("Corruption: block checksum mismatch: in x.sst"), "/d", "x")
    assert isinstance(corrupt, StoreCorruptError)
    locked = store_error(
        Exception("IO error: While lock file: /d/LOCK: Resource temporarily unavailable"), "/d", "x"
    )
    assert isinstance(locked, StoreLockedError)
    full = store_error(
        Exception("IO error: No space left on device: While appending to file: /d/000012.log"),
        "/d",
        "x",
    )
    assert isinstance(full, StoreIOError)
    assert full.retriable
    other = store_error(Exception("Invalid argument: Column family not found"), "/d", "x")
    assert type(other) is StoreError
    # Words are not statuses: a message that only mentions a lock or a corruption.
    assert status_of(Exception("the block was locked")) is None
    assert store_error(Exception("lock Corruption: x"), "/d", "x") is None
    assert store_error(KeyError("Corruption: x"), "/d", "x") is None


async def test_a_corrupt_read_in_a_handler_is_not_the_handlers_failure(tmp_path: Path) -> None:
    """The orders app parked 720 valid events this way: the read raised inside the handler
    and the agent's policy (Park) took it as the handler's failure."""
    path = tmp_path / "db"
    _store_with_ssts(path)
    _rot_data_blocks(path)
    app = App("t")

    @app.agent(app.topic("in", partitions=1), tables=[TABLE], on_failure=Park("parked"))
    async def count(event: Event, rows: TableView[dict[str, int]]) -> None:
        assert event.stream_id is not None
        rows[event.stream_id] = {"n": (rows.get(event.stream_id) or {"n": 0})["n"] + 1}

    store = RocksStore(path, SPACES, open_timeout_s=1)
    try:
        tables = PartitionTables([TABLE], store, 0)
        raised = 0
        for key in KEYS:
            event = Event.create("counted", stream_id=key, data={})
            try:
                await handle(count, event, tables)
            except StoreCorruptError:
                raised += 1
                break
        assert raised == 1
        assert not tables.take_batch(tables.checkpoint).data["rows"].get(KEYS[-1].encode())
    finally:
        store.close()


def test_a_wiped_store_serves_again(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _store_with_ssts(path)
    _rot_data_blocks(path)
    store = RocksStore(path, SPACES, open_timeout_s=1)
    try:
        with pytest.raises(StoreCorruptError):
            store.scan(TABLE.data_space, None, len(KEYS))
        store.wipe()
        store.write({TABLE.data_space: {b"k": b"v"}})
        assert store.get(TABLE.data_space, b"k") == b"v"
        assert store.get(TABLE.data_space, KEYS[0].encode()) is None
    finally:
        store.close()
