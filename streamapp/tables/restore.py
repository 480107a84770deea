"""Restore a partition's tables from their changelogs (read_committed).

Reads each table's changelog partition from the store's recorded position to the end,
applies committed records in chunks (each chunk one atomic store write with the new
positions), and leaves the store's checkpoint at the last checkpoint record restored.
Aborted batches are invisible to a ``read_committed`` reader, so no partial batch is
ever applied as if it were whole.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from .changelog import CHECKPOINT, DATA, VERSION
from .partition import CHECKPOINT_KEY, META, Checkpoint, PartitionTables

log = logging.getLogger("streamapp.partition")

CHUNK = 5000


async def restore(
    tables: PartitionTables,
    topics: dict[str, str],
    bootstrap: str,
    *,
    label: str = "",
    stall_timeout_s: float = 60.0,
) -> int:
    """Bring ``tables`` up to its changelogs; returns the number of records applied."""
    partition = tables.partition
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    try:
        await consumer.start()
        by_tp = {TopicPartition(topic, partition): name for name, topic in topics.items()}
        consumer.assign(list(by_tp))
        cp = tables.checkpoint
        for tp, name in by_tp.items():
            consumer.seek(tp, cp.changelog.get(name, 0))
        ends = await consumer.end_offsets(list(by_tp))
        pending = {tp for tp in by_tp if cp.changelog.get(by_tp[tp], 0) < ends[tp]}
        behind = sum(ends[tp] - cp.changelog.get(by_tp[tp], 0) for tp in pending)
        if behind:
            log.info("restoring %s: up to %d changelog records", label, behind)
        applied = 0
        last_progress = time.monotonic()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=CHUNK)
            changes: dict[str, dict[bytes, bytes | None]] = {}
            for tp, recs in batch.items():
                applied += _apply(tables, by_tp[tp], recs, changes, cp)
            for tp in list(pending):
                position = await consumer.position(tp)
                cp.changelog[by_tp[tp]] = position
                if position >= ends[tp]:
                    pending.discard(tp)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in pending)
                raise TimeoutError(
                    f"restore of {names} made no progress for {stall_timeout_s:.0f}s "
                    "(setting restore_stall_timeout_s)"
                )
            changes[META] = {CHECKPOINT_KEY: _settled(cp).encode()}
            tables.store.write(changes)  # holds the GIL anyway; never races close()
        tables.checkpoint = _settled(cp)
        tables.store.write({META: {CHECKPOINT_KEY: tables.checkpoint.encode()}})
        return applied
    finally:
        await consumer.stop()


def _apply(
    tables: PartitionTables,
    name: str,
    recs: list[Any],
    changes: dict[str, dict[bytes, bytes | None]],
    cp: Checkpoint,
) -> int:
    table = tables.view(name).table
    data = changes.setdefault(table.data_space, {})
    versions = changes.setdefault(table.version_space, {})
    for rec in recs:
        key: bytes = rec.key or b""
        tag, rest = key[:1], key[1:]
        if tag == DATA:
            data[rest] = rec.value
        elif tag == VERSION:
            versions[rest] = rec.value
        elif tag == CHECKPOINT:
            cp.seen[name] = orjson.loads(rec.value)["offset"]
        else:
            log.warning("changelog %s: record with unknown key tag %r skipped", rec.topic, tag)
    return len(recs)


def _settled(cp: Checkpoint) -> Checkpoint:
    offsets = [o for o in cp.seen.values() if o is not None]
    offset = max(offsets) if offsets else cp.offset
    return Checkpoint(offset=offset, changelog=dict(cp.changelog), seen=dict(cp.seen))
