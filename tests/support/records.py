"""Reading a topic's records to its end in a test, with a wait that ends on progress."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.support.waits import until


async def read_to_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> list[Any]:
    """Every record ``consumer`` (started, not subscribed) reads of ``tps``, from each
    partition's start to its end as it is now, by partition and offset. Fails once no
    partition's position moved for :data:`~tests.support.waits.STALLED_S`: the ends are
    known up front, so the read only goes on while it gets closer to them."""
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    ends = await consumer.end_offsets(tps)
    got: list[Any] = []
    positions: dict[TopicPartition, int] = {}

    async def at_end() -> bool:
        positions.update({tp: await consumer.position(tp) for tp in tps})
        behind = [tp for tp in tps if positions[tp] < ends[tp]]
        if behind:
            batch = await consumer.getmany(*behind, timeout_ms=500)
            got.extend(r for rs in batch.values() for r in rs)
        return not behind

    topics = sorted({tp.topic for tp in tps})
    await until(
        at_end,
        what=f"{', '.join(topics)} read to its end",
        progress=lambda: tuple(sorted((tp.partition, o) for tp, o in positions.items())),
        poll_s=0,
        detail=lambda: f"positions {positions}, ends {ends}",
    )
    return sorted(got, key=lambda r: (r.partition, r.offset))
