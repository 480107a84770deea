"""The partitioners: which partition a key belongs to, for every transport and view.

A topic names the partitioner its producers use (``app.topic(..., partitioner=...)``),
and everything that places a key of that topic uses the same one: the table write
check, view routing, the event-store replay's share of each partition, the sinks and
the RabbitMQ router.

- ``murmur2`` (the default): Kafka's default partitioner, murmur2 of the key bytes,
  sign bit cleared, modulo the partition count. What Kafka's Java client, Quix Streams,
  kafkajs, aiokafka and streamapp's own sinks use.
- ``crc32``: librdkafka's default (``consistent_random``: CRC-32 of the key bytes,
  unsigned, modulo the partition count), what confluent-kafka (Python, Go, .NET),
  kcat and the C and Node clients built on librdkafka use unless told otherwise. For a
  null or empty key librdkafka picks a random partition: such records cannot be placed
  by key at all.
"""

from __future__ import annotations

import enum
import zlib

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


class Partitioner(enum.StrEnum):
    """How a topic's producers pick a key's partition (``app.topic(..., partitioner=...)``)."""

    MURMUR2 = "murmur2"
    """Kafka's default (Java client, Quix Streams, kafkajs, aiokafka, streamapp's sinks)."""
    CRC32 = "crc32"
    """librdkafka's default, ``consistent_random`` (confluent-kafka, kcat, librdkafka
    clients in Go, C, .NET, Node), for records with a key."""


def partitioner_of(topic: str, value: str) -> Partitioner:
    """``value`` as a :class:`Partitioner`, or ValueError naming the topic and the choices."""
    try:
        return Partitioner(value)
    except ValueError:
        choices = ", ".join(repr(p.value) for p in Partitioner)
        raise ValueError(
            f"topic {topic!r}: partitioner={value!r} is not one of {choices}: name the "
            "partitioner the topic's producers use ('murmur2': Kafka's Java client, Quix "
            "Streams, kafkajs; 'crc32': librdkafka's default, confluent-kafka and kcat)"
        ) from None


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


def partition_for(
    key: bytes, partitions: int, partitioner: Partitioner = Partitioner.MURMUR2
) -> int:
    """The partition of ``key`` among ``partitions`` by ``partitioner`` (default:
    Kafka's murmur2; ``CRC32``: librdkafka's ``consistent_random`` for a keyed record)."""
    if partitioner is Partitioner.CRC32:
        return zlib.crc32(key) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions
