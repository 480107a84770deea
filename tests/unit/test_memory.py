"""The worker's RocksDB memory bound: setting memory_limit_mb, one shared block cache and
write-buffer manager for every partition store, stores that work within it."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamapp import ConfigError, Settings
from streamapp.tables.rocksdb.cache import MAX_WRITE_BUFFER, RocksMemory, rocks_memory
from streamapp.tables.store import RocksStore, rocks_opener
from streamapp.web.metrics import WorkerMetrics

SPACES = ["t:a", "versions"]


def test_memory_limit_default_env_and_validation() -> None:
    assert Settings(app_id="a").memory_limit_mb == 256
    env = {"STREAMAPP_MEMORY_LIMIT_MB": "64"}
    assert Settings.from_env("a", env=env).memory_limit_mb == 64
    assert Settings(app_id="a", memory_limit_mb=16).memory_limit_mb == 16
    for bad in (15, 0, -1):
        with pytest.raises(ConfigError, match=r"memory_limit_mb \(STREAMAPP_MEMORY_LIMIT_MB\)"):
            Settings(app_id="a", memory_limit_mb=bad)
    with pytest.raises(ConfigError, match="STREAMAPP_MEMORY_LIMIT_MB"):
        Settings.from_env("a", env={"STREAMAPP_MEMORY_LIMIT_MB": "lots"})


def test_one_memory_per_limit_in_the_process() -> None:
    first = rocks_memory(48)
    assert rocks_memory(48) is first
    assert rocks_memory(49) is not first
    assert first.limit_bytes == 48 << 20
    assert first.write_buffer_size <= MAX_WRITE_BUFFER
    assert first.usage()["limit"] == 48 << 20


def test_every_store_of_a_worker_shares_one_cache_and_manager(tmp_path: Path) -> None:
    settings = Settings(app_id="a", data_dir=tmp_path, memory_limit_mb=40)
    stores = [
        rocks_opener(settings, "a", agent, p)(SPACES) for agent in ("x", "y") for p in range(3)
    ]
    try:
        memories = {id(s.memory) for s in stores if isinstance(s, RocksStore)}
        assert memories == {id(rocks_memory(40))}
        assert len({id(s.memory.cache) for s in stores if isinstance(s, RocksStore)}) == 1
    finally:
        for store in stores:
            store.close()


def test_a_store_works_within_a_small_bound_and_its_memtables_flush(tmp_path: Path) -> None:
    memory = rocks_memory(16)
    store = RocksStore(tmp_path / "db", SPACES, memory=memory, cache_keys=0)
    value = b"v" * 1000
    written = 0
    for chunk in range(40):  # 40 MB through memtables of a 16 MB bound
        store.write({"t:a": {f"k{chunk:02d}-{i:04d}".encode(): value for i in range(1000)}})
        written += 1000 * len(value)
    memtables = store._db.property_int_value("rocksdb.cur-size-all-mem-tables")
    assert memtables < written // 4  # flushed to SST files, not all held in memory
    assert memory.usage()["memtables"] <= memory.limit_bytes
    assert store.get("t:a", b"k00-0000") == value
    assert store.get("t:a", b"k39-0999") == value
    assert store.get("t:a", b"k40-0000") is None
    store.close()
    again = RocksStore(tmp_path / "db", SPACES, memory=memory)
    assert again.get("t:a", b"k17-0500") == value
    assert len(again.scan("t:a", None, 5000)) == 5000
    again.close()


def test_a_store_without_memory_uses_the_default_limit(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", SPACES)
    try:
        assert store.memory is rocks_memory(Settings(app_id="a").memory_limit_mb)
    finally:
        store.close()


def test_metrics_report_rocksdb_memory() -> None:
    metrics = WorkerMetrics()
    memory: RocksMemory = rocks_memory(32)
    metrics.watch_memory(memory)
    text = metrics.render().decode()
    assert 'streamapp_rocksdb_memory_bytes{part="limit"} 3.3554432e+07' in text
    assert 'streamapp_rocksdb_memory_bytes{part="memtables"}' in text


def test_read_cache_keeps_exact_size_copies_of_written_values(tmp_path: Path) -> None:
    """A value from orjson.dumps keeps its ~4 KB build buffer; the cache must not."""
    import orjson

    store = RocksStore(tmp_path / "db", SPACES, memory=rocks_memory(16))
    try:
        value = orjson.dumps({"status": "paid", "version": 3})
        store.write({"t:a": {b"k": value}})
        cached = store.get("t:a", b"k")
        assert cached == value
        assert cached is not value
    finally:
        store.close()
