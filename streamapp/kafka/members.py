"""Group membership for views: who owns which partition, and where its views answer.

Each worker writes one record, keyed by its id, to the compacted ``{app}-members`` topic
(made by ``streamapp topics create``): its views URL and the partitions it owns, each
with the time it was claimed. Every worker reads the topic from the start and follows
it. The owner of a partition is the most recent claimant, so a dead worker's stale
claim loses to its successor's (claim times are wall clocks: keep hosts in NTP sync).
A clean stop writes a tombstone. Kafka's group decides ownership; this topic only tells
views where the owner is, and a wrong guess is safe: a worker asked for a partition it
does not own answers 421, which the asking worker turns into 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ..app import App
from ..engine.assignment import Assignment
from ..engine.parking import Publisher
from ..errors import PublishError
from ..settings import Settings
from .topics import partition_counts

log = logging.getLogger("streamapp.members")

TICK_S = 0.2
"""How often a worker compares its partitions with what it last wrote."""
TOMBSTONE_TIMEOUT_S = 5.0
"""How long a leaving worker tries to write its tombstone (a bound on the stop)."""
REFRESH_S = 30.0
"""A worker rewrites its record this often even when nothing changed."""


class KafkaMembers:
    """This worker's membership record, and everyone's, as a views directory."""

    def __init__(
        self, app: App, settings: Settings, assignment: Assignment, worker_id: str, sink: Publisher
    ) -> None:
        self.app, self.settings, self.assignment = app, settings, assignment
        self.worker_id, self.sink = worker_id, sink
        self.topic = app.members_topic
        self.url = ""
        self.members: dict[str, dict[str, Any]] = {}
        """Every other worker's last record, by worker id."""
        self._since: dict[tuple[str, int], int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._written: tuple[frozenset[tuple[str, int]], float] | None = None

    async def start(self, url: str) -> bool:
        """Join the directory with views at ``url``; False when the topic is missing."""
        self.url = url
        if not (await partition_counts(self.settings, [self.topic])).get(self.topic):
            log.warning(
                "topic %s is missing: views answer 421 for other workers' partitions instead "
                "of forwarding; create it with `streamapp topics create`",
                self.topic,
            )
            return False
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            enable_auto_commit=False,
            client_id=f"{self.app.id}-members",
        )
        await consumer.start()
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        self._consumer = consumer
        self._tasks = [
            asyncio.create_task(self._read(), name="members reader"),
            asyncio.create_task(self._write(), name="members writer"),
        ]
        self.assignment.directory = self
        return True

    async def stop(self) -> None:
        """Leave: a tombstone, so that others stop forwarding here at once."""
        self.assignment.directory = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._consumer is not None:
            try:  # best effort: the next owner's claim wins anyway, just later
                async with asyncio.timeout(TOMBSTONE_TIMEOUT_S):
                    await self.sink.publish(self.topic, None, key=self.worker_id.encode())
            except (PublishError, TimeoutError) as exc:
                log.warning("%s: no tombstone written on leave (%r)", self.topic, exc)
            await self._consumer.stop()

    # Directory ------------------------------------------------------------------------
    def owner_url(self, topic: str, partition: int) -> str | None:
        best_since, best_url = self._since.get((topic, partition), -1), None
        for record in self.members.values():
            for t, p, since in record.get("partitions", ()):
                if t == topic and p == partition and since > best_since:
                    best_since, best_url = since, record.get("url")
        return best_url

    # loops ----------------------------------------------------------------------------
    async def _read(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                fetched = await consumer.getmany(timeout_ms=500)
            except KafkaError as exc:
                log.warning("reading %s failed (%r); reading again", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            for records in fetched.values():
                for r in records:
                    self._apply(r.key, r.value)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        worker = key.decode(errors="replace")
        if worker == self.worker_id:
            return
        if value is None:
            self.members.pop(worker, None)
            return
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            log.warning("%s: record of %s is not JSON; ignored", self.topic, worker)
            return
        self.members[worker] = record

    async def _write(self) -> None:
        while True:
            owned = frozenset(self.assignment.tasks) if not self.assignment.rebalancing else None
            if owned is not None:
                now_ms = int(time.time() * 1000)
                self._since = {tp: self._since.get(tp, now_ms) for tp in owned}
                last = self._written
                stale = last is None or time.monotonic() - last[1] > REFRESH_S
                if stale or (last is not None and last[0] != owned):
                    try:
                        await self._publish()
                        self._written = (owned, time.monotonic())
                    except PublishError as exc:
                        log.warning("writing to %s failed (%r); trying again", self.topic, exc)
            await asyncio.sleep(TICK_S)

    async def _publish(self) -> None:
        record = {
            "worker": self.worker_id,
            "url": self.url,
            "partitions": [[t, p, since] for (t, p), since in sorted(self._since.items())],
            "written_ms": int(time.time() * 1000),
        }
        await self.sink.publish(self.topic, orjson.dumps(record), key=self.worker_id.encode())
