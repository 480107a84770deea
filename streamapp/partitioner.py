"""The one partitioner: which partition a key belongs to, for every transport and view.

Kafka's default partitioner (murmur2 of the key bytes, sign bit cleared, modulo the
partition count), so that a Kafka producer in any language, the RabbitMQ router, the
table write check and view routing all agree on where a stream lives.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (Kafka's default for keyed records)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
