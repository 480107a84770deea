"""Store contract, run against MemoryStore and RocksStore; RocksStore durability and lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamapp import StoreLockedError
from streamapp.tables.store import MemoryStore, RocksStore, Store

SPACES = ["meta", "t:a", "t:b"]


@pytest.fixture(params=["memory", "rocks"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore(SPACES)
    else:
        made = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    yield made
    made.close()


class TestStoreContract:
    def test_empty(self, store: Store) -> None:
        for space in SPACES:
            assert store.get(space, b"k") is None
            assert store.scan(space, None, 1000) == []

    def test_write_get_items_per_space(self, store: Store) -> None:
        store.write({"t:a": {b"k2": b"a2", b"k1": b"a1"}, "t:b": {b"k1": b"b1"}})
        assert store.get("t:a", b"k1") == b"a1"
        assert store.get("t:a", b"k2") == b"a2"
        assert store.get("t:b", b"k1") == b"b1"
        assert store.get("t:b", b"k2") is None
        assert store.get("meta", b"k1") is None
        assert store.scan("t:a", None, 1000) == [(b"k1", b"a1"), (b"k2", b"a2")]
        assert store.scan("t:b", None, 1000) == [(b"k1", b"b1")]

    def test_items_in_bytewise_key_order(self, store: Store) -> None:
        keys = [b"\xff", b"b", b"a", b"\x00\x01", b"aa", b""]
        store.write({"t:a": {k: b"v" + k for k in keys}})
        assert [k for k, _ in store.scan("t:a", None, 1000)] == sorted(keys)

    def test_overwrite_and_delete(self, store: Store) -> None:
        store.write({"t:a": {b"k": b"1", b"gone": b"x"}})
        store.write({"t:a": {b"k": b"2", b"gone": None, b"never": None}})
        assert store.get("t:a", b"k") == b"2"
        assert store.get("t:a", b"gone") is None
        assert store.get("t:a", b"never") is None
        assert store.scan("t:a", None, 1000) == [(b"k", b"2")]

    def test_binary_keys_and_values(self, store: Store) -> None:
        key, value = bytes(range(256)), b"\x00" * 10 + b"\xff"
        store.write({"t:b": {key: value}})
        assert store.get("t:b", key) == value

    def test_multi_space_write(self, store: Store) -> None:
        store.write(
            {
                "t:a": {b"x": b"1"},
                "t:b": {b"y": b"2"},
                "meta": {b"checkpoint": b'{"offset": 7}'},
            }
        )
        assert store.get("t:a", b"x") == b"1"
        assert store.get("t:b", b"y") == b"2"
        assert store.get("meta", b"checkpoint") == b'{"offset": 7}'

    def test_empty_write_changes_nothing(self, store: Store) -> None:
        store.write({"t:a": {b"x": b"1"}})
        store.write({})
        store.write({"t:a": {}, "t:b": {}})
        assert store.scan("t:a", None, 1000) == [(b"x", b"1")]

    def test_scan_pages_after_a_key(self, store: Store) -> None:
        store.write({"t:a": {bytes([i]): b"v" for i in range(10)}})
        first = store.scan("t:a", None, 4)
        assert [k for k, _ in first] == [bytes([i]) for i in range(4)]
        rest = store.scan("t:a", first[-1][0], 100)
        assert [k for k, _ in rest] == [bytes([i]) for i in range(4, 10)]
        assert store.scan("t:a", b"\x09", 5) == []
        assert store.scan("t:a", b"\x03\x00", 2) == [(b"\x04", b"v"), (b"\x05", b"v")]

    def test_wipe_empties_every_space(self, store: Store) -> None:
        store.write({"t:a": {b"x": b"1"}, "meta": {b"checkpoint": b"c"}})
        store.wipe()
        assert store.get("t:a", b"x") is None
        assert store.get("meta", b"checkpoint") is None
        store.write({"t:b": {b"y": b"2"}})
        assert store.get("t:b", b"y") == b"2"

    def test_failed_write_is_all_or_nothing(self, store: Store) -> None:
        store.write({"t:a": {b"x": b"old"}})
        with pytest.raises(KeyError):
            store.write({"t:a": {b"x": b"new", b"y": b"new"}, "no-such-space": {b"z": b"1"}})
        assert store.get("t:a", b"x") == b"old"
        assert store.get("t:a", b"y") is None


# --- RocksStore only -------------------------------------------------------------


def test_rocks_durable_across_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksStore(path, SPACES, open_timeout_s=1)
    first.write({"t:a": {b"k": b"v", b"del": b"x"}, "meta": {b"checkpoint": b"c1"}})
    first.write({"t:a": {b"del": None}, "t:b": {b"k": b"w"}})
    first.close()
    again = RocksStore(path, SPACES, open_timeout_s=1)
    try:
        assert again.get("t:a", b"k") == b"v"
        assert again.get("t:a", b"del") is None
        assert again.get("t:b", b"k") == b"w"
        assert again.get("meta", b"checkpoint") == b"c1"
        assert again.scan("t:a", None, 1000) == [(b"k", b"v")]
    finally:
        again.close()


def test_rocks_reopen_with_a_new_space(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksStore(path, ["meta"], open_timeout_s=1)
    first.write({"meta": {b"k": b"v"}})
    first.close()
    again = RocksStore(path, ["meta", "t:new"], open_timeout_s=1)
    try:
        assert again.get("meta", b"k") == b"v"
        again.write({"t:new": {b"a": b"b"}})
        assert again.get("t:new", b"a") == b"b"
    finally:
        again.close()


def test_rocks_values_are_raw_bytes_not_pickled(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    path = tmp_path / "db"
    store = RocksStore(path, ["meta"], open_timeout_s=1)
    store.write({"meta": {b"k": b"plain"}})
    store.close()
    opts = Options(raw_mode=True)
    db = Rdict(str(path), opts, column_families={"meta": Options(raw_mode=True)})
    try:
        assert db.get_column_family("meta")[b"k"] == b"plain"
    finally:
        db.close()


def test_rocks_second_open_times_out_with_store_locked(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksStore(path, SPACES, open_timeout_s=1)
    try:
        started = time.monotonic()
        with pytest.raises(StoreLockedError) as info:
            RocksStore(path, SPACES, open_timeout_s=0.3)
        assert time.monotonic() - started >= 0.3  # it retried for the whole timeout first
        assert str(path) in str(info.value)
        assert "store_open_timeout_s" in str(info.value)
        assert info.value.retriable is True
    finally:
        first.close()


def test_rocks_second_open_succeeds_when_first_closes_in_time(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksStore(path, SPACES, open_timeout_s=1)
    first.write({"t:a": {b"k": b"from-first"}})
    closer = threading.Timer(0.2, first.close)
    started = time.monotonic()
    closer.start()
    try:
        second = RocksStore(path, SPACES, open_timeout_s=3)
    finally:
        closer.join()
    try:
        assert time.monotonic() - started >= 0.2
        assert second.get("t:a", b"k") == b"from-first"
    finally:
        second.close()


def test_rocks_close_is_idempotent(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    store.close()
    store.close()
    reopened = RocksStore(tmp_path / "db", SPACES, open_timeout_s=0.3)
    reopened.close()


def test_rocks_scan_after_close_is_a_clear_error_and_holds_no_lock(tmp_path: Path) -> None:
    from streamapp.errors import StoreClosedError

    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    store.write({"t:a": {bytes([i]): b"v" for i in range(5)}})
    page = store.scan("t:a", None, 2)  # a reader part-way through a table
    store.close()
    again = RocksStore(tmp_path / "db", SPACES, open_timeout_s=0.5)  # the LOCK is free
    again.close()
    with pytest.raises(StoreClosedError, match="closed"):
        store.scan("t:a", page[-1][0], 2)


def test_rocks_store_with_undeclared_spaces_is_refused_clearly(tmp_path: Path) -> None:
    from streamapp.errors import StoreFormatError

    old = RocksStore(tmp_path / "db", ["meta", "t:a", "v:a"], open_timeout_s=1)
    old.write({"v:a": {b"o-1": b"\x00" * 8}})
    old.close()
    with pytest.raises(StoreFormatError, match="Remove the directory"):
        RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)


def test_rocks_read_cache_is_bounded_and_exact(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1, cache_keys=4)
    try:
        store.write({"t:a": {f"k{i}".encode(): f"v{i}".encode() for i in range(10)}})
        for _ in range(2):
            for i in range(12):
                want = f"v{i}".encode() if i < 10 else None
                assert store.get("t:a", f"k{i}".encode()) == want
        store.write({"t:a": {b"k3": None, b"k4": b"new"}})
        assert store.get("t:a", b"k3") is None
        assert store.get("t:a", b"k4") == b"new"
        assert all(len(cached) <= 4 for cached in store._cache.values())
    finally:
        store.close()


def test_rocks_restore_write_keeps_nothing_cached_and_reads_exact(tmp_path: Path) -> None:
    """A restore's bulk write (``keep=False``) leaves the read cache empty, so nothing it
    held before (a value, or a key known absent) is answered after it."""
    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    try:
        store.write({"t:a": {b"k1": b"old"}})
        assert store.get("t:a", b"k1") == b"old"
        assert store.get("t:a", b"k2") is None  # cached as absent
        store.write({"t:a": {b"k1": b"new", b"k2": b"made"}, "t:b": {b"x": b"y"}}, keep=False)
        assert all(len(cached) == 0 for cached in store._cache.values())
        assert store.get("t:a", b"k1") == b"new"
        assert store.get("t:a", b"k2") == b"made"
        assert store.get("t:b", b"x") == b"y"
    finally:
        store.close()


def test_rocks_write_that_raises_leaves_no_stale_cached_value(tmp_path: Path) -> None:
    """A write whose outcome is unknown (it raised, yet may have landed): reads go to
    RocksDB again instead of trusting what was cached before it."""
    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    real = store._db

    class LandsThenRaises:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def write(self, batch: object, options: object) -> None:
            real.write(batch, options)
            raise RuntimeError("lost the answer")

    try:
        store.write({"t:a": {b"k": b"old"}})
        assert store.get("t:a", b"k") == b"old"
        store._db = LandsThenRaises()
        with pytest.raises(RuntimeError):
            store.write({"t:a": {b"k": b"new"}})
        store._db = real
        assert store.get("t:a", b"k") == b"new"
    finally:
        store._db = real
        store.close()


def test_rocks_without_a_read_cache_reads_rocksdb_each_time(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1, cache_keys=0)
    try:
        store.write({"t:a": {b"k": b"v"}})
        read = store.reader("t:a")
        assert read(b"k") == b"v"
        assert read(b"absent") is None
        assert store.get("t:a", b"k") == b"v"
        assert all(len(cached) == 0 for cached in store._cache.values())
    finally:
        store.close()


def test_rocks_reader_stays_valid_across_wipe_and_fails_clearly_after_close(
    tmp_path: Path,
) -> None:
    from streamapp.errors import StoreClosedError

    store = RocksStore(tmp_path / "db", SPACES, open_timeout_s=1)
    read = store.reader("t:a")
    store.write({"t:a": {b"k": b"v"}})
    assert read(b"k") == b"v"
    store.wipe()
    assert read(b"k") is None
    store.write({"t:a": {b"k": b"again"}})
    assert read(b"k") == b"again"
    store.close()
    with pytest.raises(StoreClosedError):
        read(b"other")
