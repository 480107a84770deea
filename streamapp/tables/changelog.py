"""Changelog topics: every table partition's changes, replicated to Kafka per batch.

DESIGN note, the choice of mechanism: Kafka transactions, restored with
``read_committed``. Each batch writes, in one transaction, every changed key of every
table of the partition, the stream versions it applied, and a checkpoint record (the
next source offset). Commit markers of our own were the alternative; they cannot make
writes to several tables' changelogs atomic, and compaction removes old markers, so a
restore could not tell a committed batch from an abandoned one. With transactions the
broker does both, and the ``transactional_id`` is stable per (app, agent, partition), so
a new owner's ``init_transactions`` fences the previous owner and aborts its open batch.

Order of a batch: changelog transaction committed, then the local store write, then
the consumer offset commit. A crash between the first two leaves the local store behind
the changelog; every assignment restores the changelog tail from the store's recorded
changelog position, so the store catches up before processing resumes.

Record keys carry a one-byte tag so that compaction keeps each kind apart:
``b"d" + key`` data (a null value deletes), ``b"v" + stream id`` the last applied
stream version (8 bytes, big-endian), ``b"c"`` the checkpoint (JSON).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from .partition import BatchChanges, encode_version

log = logging.getLogger(__name__)

DATA = b"d"
VERSION = b"v"
CHECKPOINT = b"c"


def changelog_topic(app_id: str, table: str) -> str:
    """The compacted changelog topic of ``table``."""
    return f"{app_id}-{table}-changelog"


def records(batch: BatchChanges, table: str) -> Iterator[tuple[bytes, bytes | None]]:
    """The changelog records of ``table`` for ``batch``, checkpoint last."""
    for key, value in batch.data.get(table, {}).items():
        yield DATA + key, value
    for sid, version in batch.versions.items():
        yield VERSION + sid, encode_version(version)
    yield CHECKPOINT, orjson.dumps({"offset": batch.offset})


class ChangelogWriter:
    """Writes one partition's batches to its tables' changelogs, one transaction each."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        topics: dict[str, str],
        partition: int,
        timeout_s: float,
    ) -> None:
        self.topics = topics
        self.transactional_id = transactional_id
        self.partition = partition
        self.timeout_s = timeout_s
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
        )

    async def start(self) -> None:
        """Start the producer; this fences any previous owner of the partition."""
        try:
            await asyncio.wait_for(self._producer.start(), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"changelog writer {self.transactional_id} did not start within "
                f"{self.timeout_s:.0f}s (setting publish_timeout_s)"
            ) from None

    async def stop(self) -> None:
        await self._producer.stop()

    async def write(self, batch: BatchChanges) -> dict[str, int]:
        """Commit ``batch`` to the changelogs; returns each table's next changelog offset."""
        try:
            return await asyncio.wait_for(self._write(batch), self.timeout_s)
        except TimeoutError:
            topics = ", ".join(f"{t}[{self.partition}]" for t in self.topics.values())
            raise TimeoutError(
                f"changelog transaction of {self.transactional_id} to {topics} not committed "
                f"within {self.timeout_s:.0f}s (setting publish_timeout_s)"
            ) from None

    async def _write(self, batch: BatchChanges) -> dict[str, int]:
        producer = self._producer
        await producer.begin_transaction()
        try:
            last: dict[str, Any] = {}
            for table, topic in self.topics.items():
                for key, value in records(batch, table):
                    last[table] = await producer.send(
                        topic, value, key=key, partition=self.partition
                    )
            await producer.commit_transaction()
        except BaseException:
            await _abort(producer)
            raise
        return {table: (await fut).offset + 1 for table, fut in last.items()}


async def _abort(producer: AIOKafkaProducer) -> None:
    try:
        await producer.abort_transaction()
    except Exception as exc:  # the producer may be fenced or stopped already
        log.debug("abort of changelog transaction failed: %r", exc)
