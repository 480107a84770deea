"""Kafka source: one consumer-group member that feeds the app's agents.

The poll loop only fetches and hands records to partition runners; runners process,
flush and commit on their own tasks with their partition paused, so a slow batch never
keeps the loop from polling (heartbeats and ``max.poll.interval.ms`` stay safe) and a
partition that restores never stalls the partitions that are ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from ..app import App
from ..settings import Settings
from .retry import with_startup_retry
from .runner import READY, PartitionRunner
from .sink import KafkaSink
from .topics import check_topics

log = logging.getLogger("streamapp.kafka")


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2), as producers place keyed records."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


class KafkaSource:
    """Consumes every agent's source topic as one member of the app's group."""

    def __init__(self, app: App, settings: Settings, sink: KafkaSink, app_ref: str) -> None:
        self.app, self.settings, self.sink, self.app_ref = app, settings, sink, app_ref
        self.runners: dict[TopicPartition, PartitionRunner] = {}
        self._agents = {a.topic.name: a for a in app.agents.values()}
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=settings.group_id,
            client_id=f"{settings.app_id}-worker",
            enable_auto_commit=False,
            auto_offset_reset=settings.auto_offset_reset,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            rebalance_timeout_ms=settings.rebalance_timeout_ms,
            isolation_level="read_committed",  # aborted upstream writes never reach agents
            partition_assignment_strategy=(RoundRobinPartitionAssignor,),
        )
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self.rebalancing = True
        """True from start (or a revocation) until the group hands out partitions."""

    async def start(self) -> None:
        """Connect (with start-up retries), check topics, join the group, start polling."""
        await check_topics(self.app, self.settings, self.app_ref)
        await self._connect()
        self._consumer.subscribe(list(self._agents), listener=_Listener(self))
        self._loop_task = asyncio.create_task(self._poll_loop(), name="poll loop")

    async def stop(self) -> None:
        """Finish batches in hand, flush, commit, close stores, leave the group."""
        self._stopping = True
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._release(list(self.runners))
        await self._consumer.stop()
        await self._release(list(self.runners))  # any taken during the leave

    async def wait(self) -> None:
        """Until the poll loop ends (it raises when the consumer fails for good)."""
        if self._loop_task is not None:
            await self._loop_task

    def owner_of(self, table: str, key: str) -> tuple[int, PartitionRunner | None]:
        """The partition of ``key`` in ``table`` and its runner here, if this worker owns it."""
        agent, _ = self.app.tables[table]
        partition = partition_for(key.encode(), agent.topic.partitions)
        return partition, self.runners.get(TopicPartition(agent.topic.name, partition))

    def status(self) -> dict[str, Any]:
        return {
            r.name: {
                "state": r.state,
                "start_offset": r.start_offset,
                "next_offset": r.next_offset,
                "processed": r.processed,
                "restored": r.restored,
            }
            for r in sorted(self.runners.values(), key=lambda r: (r.tp.topic, r.tp.partition))
        }

    async def _connect(self) -> None:
        await with_startup_retry(self.settings, "Kafka consumer", self._consumer.start)

    async def _poll_loop(self) -> None:
        consumer = self._consumer
        while not self._stopping:
            try:
                fetched = await consumer.getmany(timeout_ms=self.settings.poll_timeout_ms)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                log.warning("poll failed (%r); polling again", exc)
                await asyncio.sleep(self.settings.poll_timeout_ms / 1000)
                continue
            for tp, records in fetched.items():
                runner = self.runners.get(tp)
                if runner is None:  # fetched before the listener made its runner
                    self._rewind_unowned(tp, records[0].offset)
                    continue
                if runner.state == READY:
                    runner.feed(records)
                else:
                    runner.dropped()

    def _rewind_unowned(self, tp: TopicPartition, offset: int) -> None:
        try:
            self._consumer.seek(tp, offset)
        except Exception as exc:  # not assigned any more: nothing to rewind
            log.debug("%s[%d]: no rewind (%r)", tp.topic, tp.partition, exc)

    def _acquire(self, assigned: Iterable[TopicPartition]) -> None:
        if self._stopping:
            return
        for tp in assigned:
            agent = self._agents.get(tp.topic)
            if agent is None:
                continue
            log.info("assigned %s[%d]", tp.topic, tp.partition)
            runner = PartitionRunner(self.app, agent, tp, self._consumer, self.sink, self.settings)
            self.runners[tp] = runner
            runner.start()

    async def _release(self, revoked: Iterable[TopicPartition]) -> None:
        runners = [self.runners.pop(tp) for tp in list(revoked) if tp in self.runners]
        results = await asyncio.gather(*(r.close() for r in runners), return_exceptions=True)
        for runner, result in zip(runners, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s failed: %r", runner.name, result)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Runs in the group coordinator: awaits only self-contained work (see PITFALLS.md)."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.source.rebalancing = True
        await self.source._release(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.source._acquire(assigned)
        self.source.rebalancing = False
