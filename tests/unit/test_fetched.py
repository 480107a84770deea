"""aiokafka's fetched records handed over as deliveries (kafka/fetched.py): the same
topic, partition, offset, key, value and headers as the ConsumerRecords aiokafka builds,
control batches and earlier offsets skipped alike, and the fetcher left alone when it is
not the plain one."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher, FetchResult, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord

from streamapp.records import DeliveryRecord
from streamapp.transports.kafka.fetched import (
    _DeliveryRecords,
    as_deliveries,
    deliver_records,
    position_of,
)

TP = TopicPartition("orders", 3)


def _records(base_offset: int, n: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(n):
        headers = [("ce_id", f"e{i}".encode()), ("content-type", b"application/json")]
        # a fixed timestamp: None would be the clock's, which moves between two batches
        stamp = 1_764_000_000_000 + i
        builder.append(i, timestamp=stamp, key=f"k{i}".encode(), value=b"{}", headers=headers)
    buffer = builder.build()
    buffer[0:8] = base_offset.to_bytes(8, "big")  # the batch's base offset
    return bytes(buffer)


def _partition_records(fetch_offset: int) -> PartitionRecords:
    raw = _records(10, 5)
    return PartitionRecords(
        TP, MemoryRecords(raw), [], fetch_offset, None, None, True, "read_committed"
    )


def test_records_read_as_deliveries_carry_what_consumer_records_carry() -> None:
    plain: list[Any] = list(_partition_records(12))
    fast = _partition_records(12)
    fast.__class__ = _DeliveryRecords
    delivered: list[Any] = list(fast)
    assert all(type(r) is ConsumerRecord for r in plain)
    assert all(type(d) is DeliveryRecord for d in delivered)
    assert [d.position for d in delivered] == [r.offset for r in plain] == [12, 13, 14]
    for d, r in zip(delivered, plain, strict=True):
        assert (d.topic, d.partition, d.key, d.value) == (r.topic, r.partition, r.key, r.value)
        assert d.headers == r.headers
    assert list(as_deliveries(delivered)) == delivered  # no copy
    assert [position_of(r) for r in delivered] == [position_of(r) for r in plain] == [12, 13, 14]
    copied = as_deliveries(plain)
    assert list(copied) == delivered
    assert [d.timestamp_ms for d in delivered] == [r.timestamp for r in plain]


def test_a_fetcher_that_is_not_the_plain_one_is_left_alone() -> None:
    consumer: Any = SimpleNamespace(_fetcher=None)  # an AIOKafkaConsumer not started
    assert deliver_records(cast(AIOKafkaConsumer, consumer)) is False

    class Other:  # another aiokafka's fetcher, or one with deserializers
        _key_deserializer = None
        _value_deserializer = bytes.decode
        _records: OrderedDict[Any, Any] = OrderedDict()

    consumer._fetcher = other = Other()
    assert deliver_records(cast(AIOKafkaConsumer, consumer)) is False
    assert type(other._records) is OrderedDict


def test_each_result_the_fetcher_stores_reads_its_records_as_deliveries() -> None:
    records: Any = OrderedDict()
    fetcher = Fetcher.__new__(Fetcher)  # the attributes deliver_records reads, no client
    fetcher._key_deserializer = fetcher._value_deserializer = None
    fetcher._records = records
    consumer: Any = SimpleNamespace(_fetcher=fetcher)
    assert deliver_records(cast(AIOKafkaConsumer, consumer)) is True
    result = FetchResult(TP, assignment=None, partition_records=_partition_records(10), backoff=0)
    fetcher._records[TP] = result
    assert type(result._partition_records) is _DeliveryRecords
    assert [type(d) for d in result._partition_records] == [DeliveryRecord] * 5
