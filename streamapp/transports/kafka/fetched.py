"""aiokafka's fetched records handed over as deliveries, with no ConsumerRecord between.

aiokafka decodes a fetch's record batches in C, then builds a ``ConsumerRecord`` (an
eleven-field dataclass, with sizes and a copy of the headers) per record, which the
source would copy again into a :class:`~streamapp.records.DeliveryRecord`: on the orders
projection the two took a tenth of the worker's CPU. :func:`deliver_records` makes one
consumer's fetcher build the delivery itself, once per record: each fetch result it
stores reads its records as deliveries (``PartitionRecords._consumer_record``). Only for
a consumer without deserializers, and only when aiokafka's fetcher is the one this was
written against (0.14): otherwise records come as aiokafka builds them and the source
copies them (:func:`as_deliveries`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher, FetchResult, PartitionRecords

from ...records import Delivery, DeliveryRecord

log = logging.getLogger("streamapp.kafka")


class _DeliveryRecords(PartitionRecords):  # type: ignore[misc]
    """A fetch result's records, read as deliveries."""

    def _consumer_record(self, tp: TopicPartition, record: Any) -> DeliveryRecord:
        return DeliveryRecord(
            tp.topic,
            tp.partition,
            record.offset,
            record.key,
            record.value,
            tuple(record.headers),
            record.timestamp,
        )


class _Delivering(OrderedDict[TopicPartition, Any]):
    """A fetcher's results by partition, whose records are read as deliveries from the
    moment the fetcher stores them (``Fetcher._records``)."""

    def __setitem__(self, tp: TopicPartition, result: Any) -> None:
        if type(result) is FetchResult:
            records = result._partition_records
            if type(records) is PartitionRecords:
                records.__class__ = _DeliveryRecords
        super().__setitem__(tp, result)


def deliver_records(consumer: AIOKafkaConsumer) -> bool:
    """Make ``consumer``'s fetcher (started) hand out deliveries; False when it cannot
    (another aiokafka, deserializers): records then come as aiokafka builds them."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    if type(fetcher) is not Fetcher or not _plain(fetcher):
        log.debug("aiokafka's fetcher is not the expected one: records are converted")
        return False
    fetcher._records = _Delivering(fetcher._records)
    return True


def _plain(fetcher: Any) -> bool:
    """No deserializers, and the private parts this module uses are there."""
    return (
        getattr(fetcher, "_key_deserializer", 0) is None
        and getattr(fetcher, "_value_deserializer", 0) is None
        and type(getattr(fetcher, "_records", None)) is OrderedDict
        and callable(getattr(PartitionRecords, "_consumer_record", None))
        and hasattr(FetchResult, "__init__")
    )


def as_deliveries(records: Sequence[Any]) -> Sequence[Delivery]:
    """Fetched records as deliveries: as they are when the fetcher made them so, else
    a copy of each ``ConsumerRecord``."""
    if records and type(records[0]) is DeliveryRecord:
        return records
    return [
        DeliveryRecord(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
        for r in records
    ]


def position_of(record: Any) -> int:
    """The offset of a fetched record, a delivery or a ``ConsumerRecord``."""
    return int(record.position if type(record) is DeliveryRecord else record.offset)
