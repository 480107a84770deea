"""Damage a stopped worker's RocksDB stores deterministically, as a bad or full disk does,
and check that each damage really produces the RocksDB status it is about."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamapp.tables.partition import spaces_for
from streamapp.tables.store import RocksStore
from tables.orders import order_status

SPACES = spaces_for([order_status])


def partition_stores(data_dir: Path, app_id: str, agent: str) -> list[Path]:
    stores = sorted((data_dir / app_id / agent).iterdir(), key=lambda p: int(p.name))
    assert stores, f"no partition stores under {data_dir}"
    return stores


def flush(store: Path) -> None:
    """Every space of a (closed) store into SST files, so that damage hits data blocks."""
    opened = RocksStore(store, SPACES, open_timeout_s=10)
    try:
        for family in opened._cfs.values():
            family.flush()
    finally:
        opened.close()


def data_ssts(store: Path) -> list[Path]:
    """SST files of the table and version spaces (the meta space's holds the checkpoint)."""
    return [f for f in store.glob("*.sst") if b"checkpoint" not in f.read_bytes()]


def _flip(path: Path, offsets: range) -> None:
    with path.open("r+b") as f:
        for offset in offsets:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))


def data_size(sst: Path) -> int:
    """Bytes of data blocks at the start of an SST file: its ``rocksdb.data.size``
    property (a varint after the key, in the uncompressed properties block)."""
    raw = sst.read_bytes()
    at = raw.find(b"data.size")
    assert at > 0, f"{sst}: no rocksdb.data.size property"
    at += len(b"data.size")
    value, shift = 0, 0
    while True:
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
        shift += 7
    assert 0 < value < len(raw), (sst, value)
    return value


def rot_data_blocks(store: Path) -> None:
    """Bit rot in the middle of the data blocks (the checkpoint's file spared: the store
    opens, and the damage shows only when a damaged block is read)."""
    for sst in data_ssts(store):
        size = data_size(sst)
        _flip(sst, range(size // 8, size * 3 // 4, 128))


def cut_to_half(store: Path) -> None:
    for sst in store.glob("*.sst"):
        os.truncate(sst, sst.stat().st_size // 2)


def damage_end(store: Path) -> None:
    """Flip bytes near the end of the files: the meta blocks (index, properties) that
    RocksDB reads when it opens a file, before the footer."""
    for sst in data_ssts(store):
        size = sst.stat().st_size
        _flip(sst, range(size - 200, size - 100, 7))


DAMAGES: dict[str, Callable[[Path], None]] = {
    "rot": rot_data_blocks,
    "half": cut_to_half,
    "end": damage_end,
}


def _read_only(store: Path) -> Any:
    from rocksdict import AccessType, Options, Rdict

    # the spaces on disk: a store drops at close the spaces it made and never wrote
    # (held streams, skipped events), so SPACES may name more than it has
    names = [n for n in Rdict.list_cf(str(store)) if n != "default"]
    return Rdict(
        str(store),
        Options(raw_mode=True),
        column_families={name: Options(raw_mode=True) for name in names},
        access_type=AccessType.read_only(),
    )


def open_status(store: Path) -> str | None:
    """RocksDB's status when the store is opened (read-only, nothing changed): None if
    it opens."""
    try:
        db = _read_only(store)
    except Exception as exc:
        return str(exc)
    db.close()
    return None


def read_statuses(store: Path, keys: list[str]) -> list[str]:
    """RocksDB's statuses of reading each of ``keys`` from the table (read-only open)."""
    db = _read_only(store)
    errors: list[str] = []
    try:
        family = db.get_column_family(order_status.data_space)
        for key in keys:
            try:
                family.get(key.encode())
            except Exception as exc:
                errors.append(str(exc))
        del family
    finally:
        db.close()
    return errors
