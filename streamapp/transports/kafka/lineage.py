"""Is a local store of this changelog? Checked at every restore, before the store is trusted.

A store is a cache of its changelog partition. When the changelog was deleted and made
again (``streamapp reset`` on another host, ``streamapp topics create`` by hand), a
store kept on disk is of the old incarnation: its offsets mean nothing in the new one.
Its checkpoint remembers the mark of the last batch it applied (random, carried by the
batch's changelog checkpoint record) and that record's offset; the store is of this
changelog only if the record at that offset is a checkpoint record with that mark (a
store restored from a changelog written before marks: with the same positions).

The check costs one fetch of one record. When the store is at the changelog's end (an
ordinary restart, a rebalance that hands a partition back) its record is the newest
checkpoint record, which compaction always keeps. A store behind its changelog may find
its record compacted away (every batch rewrites the one checkpoint key, and the cleaner
keeps only the newest once its segment is closed): its lineage cannot be proven then,
and it is restored in full, which costs reading the whole (compacted) changelog
partition instead of its tail.
"""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from ...errors import SourceError
from ...tables.changelog import CHECKPOINT
from ...tables.checkpoint import Checkpoint

FETCH_WAIT_MS = 500


async def mismatch(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    checkpoint: Checkpoint,
    end: int,
    stall_timeout_s: float,
) -> str | None:
    """Why the store of ``checkpoint`` is not proven of changelog partition ``tp`` (None:
    it is, or it applied nothing of it). ``end``: the partition's end offset. Leaves
    ``consumer`` positioned anywhere."""
    applied = checkpoint.changelog
    if applied <= 0:
        return None  # nothing of any changelog applied: nothing to contradict
    if applied > end:
        return (
            f"the store applied this changelog up to offset {applied}, but it ends at {end} "
            "(deleted and made again since)"
        )
    if checkpoint.marked < 0:
        return (
            "the store's checkpoint names no changelog record to check (written before "
            "streamapp checked lineage, or restored only in part)"
        )
    start = (await consumer.beginning_offsets([tp]))[tp]
    if checkpoint.marked < start:
        return (
            f"its last checkpoint record (offset {checkpoint.marked}) is gone: the changelog "
            f"starts at {start}"
        )
    found = await _record_at(consumer, tp, checkpoint.marked, end, stall_timeout_s)
    if found is None:
        return (
            f"its last checkpoint record (offset {checkpoint.marked}) is not in the changelog "
            "(compacted away, or another incarnation): its lineage cannot be proven"
        )
    offset, key, value = found
    if offset != checkpoint.marked:
        return (
            f"its last checkpoint record (offset {checkpoint.marked}) is not in the changelog "
            f"(the next record is at {offset}: compacted away, or another incarnation), so "
            "its lineage cannot be proven"
        )
    if key != CHECKPOINT or value is None:
        return f"offset {offset} holds a data record, not the store's checkpoint record"
    try:
        other = Checkpoint().with_positions(value)
    except ValueError:
        return f"the checkpoint record at offset {offset} is not one streamapp wrote"
    if other.mark != checkpoint.mark:
        return (
            f"the checkpoint record at offset {offset} carries mark {other.mark or '(none)'}, "
            f"the store applied mark {checkpoint.mark or '(none)'}: another incarnation of "
            "the changelog"
        )
    if not other.mark and _positions(other) != _positions(checkpoint):
        # Written before marks (restored from such a changelog): the positions must agree.
        return (
            f"the checkpoint record at offset {offset} holds positions {_positions(other)}, "
            f"the store {_positions(checkpoint)}: another incarnation of the changelog"
        )
    return None


def _positions(cp: Checkpoint) -> tuple[int | None, int | None, bool]:
    return cp.live, cp.history, cp.caught_up


async def _record_at(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    offset: int,
    end: int,
    stall_timeout_s: float,
) -> tuple[int, bytes | None, bytes | None] | None:
    """The first committed record at or after ``offset`` and before ``end`` (None: none,
    only commit markers or aborted records are left)."""
    consumer.seek(tp, offset)
    consumer.resume(tp)  # a restore keeps it paused (it fetches by itself)
    try:
        return await _first_at(consumer, tp, offset, end, stall_timeout_s)
    finally:
        consumer.pause(tp)


async def _first_at(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    offset: int,
    end: int,
    stall_timeout_s: float,
) -> tuple[int, bytes | None, bytes | None] | None:
    deadline = time.monotonic() + stall_timeout_s
    while True:
        fetched = await consumer.getmany(tp, timeout_ms=FETCH_WAIT_MS, max_records=1)
        for rec in fetched.get(tp, ()):
            return int(rec.offset), rec.key, rec.value
        if await consumer.position(tp) >= end:
            return None
        if time.monotonic() > deadline:
            raise SourceError(
                f"checking the local store against changelog {tp.topic}[{tp.partition}]: no "
                f"record at offset {offset} within {stall_timeout_s:.0f}s "
                "(setting restore_stall_timeout_s)"
            )
