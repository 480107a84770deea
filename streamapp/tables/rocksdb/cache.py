"""RocksDB's memory for the whole worker: one block cache and one write-buffer manager,
shared by every partition store the process opens.

Without them each store's column families keep their own 64 MB memtables and 8 MB block
cache: a worker with eight partition stores grew by the size of every write until those
memtables filled (docs/settings.md: Memory). Here, as in Kafka Streams' bounded-memory RocksDB
config, memtables are charged to the one block cache of ``memory_limit_mb`` bytes, so
RocksDB's blocks, index and filter blocks and memtables together stay near that size,
and small per-column-family write buffers make memtables flush early.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

MEMTABLE_SHARE = 0.5
"""Of the limit, what memtables may hold before the write-buffer manager flushes the
largest; blocks (data, index, filter) use the rest of the cache."""
MAX_WRITE_BUFFER = 8 << 20
"""Largest memtable of one column family (RocksDB's default is 64 MB)."""
MIN_WRITE_BUFFER = 256 << 10


@dataclass(frozen=True, slots=True)
class RocksMemory:
    """The process-wide RocksDB memory of one ``memory_limit_mb``: get it with
    :func:`rocks_memory`, never build it yourself (a second one would double the bound)."""

    limit_bytes: int
    cache: Any
    """rocksdict ``Cache`` (LRU): the block cache, and the memtables' reservations."""
    write_buffers: Any
    """rocksdict ``WriteBufferManager`` charged to :attr:`cache`."""
    write_buffer_size: int
    """Memtable size of each column family before it is flushed."""

    def options(self) -> Any:
        """rocksdict ``Options`` (raw mode) of one store or column family, within the bound."""
        from rocksdict import BlockBasedOptions, Options

        opts = Options(raw_mode=True)
        opts.set_write_buffer_manager(self.write_buffers)
        opts.set_write_buffer_size(self.write_buffer_size)
        opts.set_max_write_buffer_number(2)  # one taking writes, one flushing
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)  # index and filters in the bound too
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        return opts

    def usage(self) -> dict[str, int]:
        """Bytes in use now: the block cache (memtable reservations included) and the
        memtables alone."""
        return {
            "limit": self.limit_bytes,
            "cache": int(self.cache.get_usage()),
            "memtables": int(self.write_buffers.get_usage()),
        }


@functools.cache
def rocks_memory(limit_mb: int) -> RocksMemory:
    """The one :class:`RocksMemory` of ``limit_mb`` in this process (setting
    ``memory_limit_mb``): every store opened with the same setting shares it."""
    from rocksdict import Cache, WriteBufferManager

    limit = limit_mb << 20
    cache = Cache(limit)
    memtables = int(limit * MEMTABLE_SHARE)
    manager = WriteBufferManager.new_write_buffer_manager_with_cache(memtables, False, cache)
    write_buffer = max(MIN_WRITE_BUFFER, min(MAX_WRITE_BUFFER, memtables // 16))
    return RocksMemory(limit, cache, manager, write_buffer)
