"""Kafka source: one consumer-group member that feeds the app's agents.

The poll loop only fetches and hands deliveries to partition tasks; tasks process,
commit and settle on their own with their partition paused, so a slow batch never keeps
the loop from polling (heartbeats and ``max.poll.interval.ms`` stay safe) and a partition
that restores or catches up never stalls the partitions that are live.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ...agents.agent import Agent
from ...app import App
from ...codecs import kafka as codec
from ...engine.assignment import Assignment
from ...engine.factory import TaskFactory
from ...engine.interfaces import TaskMetrics
from ...engine.lease import Lease
from ...engine.metrics import NO_METRICS
from ...engine.parking import parker
from ...engine.phase import LiveState, Phase
from ...engine.task import PartitionTask
from ...engine.task_config import TaskConfig
from ...engine.task_surface import HistoryFeed
from ...errors import SourceError
from ...events import Event
from ...failures.outcomes import Retry
from ...records import Delivery
from ...settings.settings import Settings
from ...tables.store import Store, rocks_opener
from ...topics import TopicSpec
from .assignor import Holdings, StickyAssignor
from .commits import FLUSH_TIMEOUT_S, OffsetCommits
from .connection import with_startup_retry
from .fetched import as_deliveries, deliver_records, position_of
from .lease import HeartbeatLease
from .members import Generation
from .port import KafkaPartitionPort
from .sink import KafkaSink
from .standby import PromotedStores, Standbys
from .topology import check_new_lanes, check_topics, delete_retention_ms
from .transaction import KafkaTransaction
from .txn_backoff import shorten_concurrent_transactions_backoff
from .txn_offsets import Member
from .txn_writer import TransactionalWriter
from .warmup import WarmupProbe, request_rejoin
from .worker_id import WorkerId

log = logging.getLogger("streamapp.kafka")
POLL_STOP_GRACE_S = 2.0
"""How long past one poll a stop waits for the poll loop before cancelling it."""


def decode(delivery: Delivery) -> Event:
    return codec.decode(delivery.key, delivery.value, delivery.headers)


def decode_bytes(delivery: Delivery) -> Event:
    return codec.decode(delivery.key, delivery.value, delivery.headers, parse_json=False)


class KafkaSource:
    """Consumes every agent's source topic as one member of the app's group.

    One partition task per (topic, partition) runs every agent of the topic. Its commits
    go into the worker's one transaction per poll cycle (:mod:`.txn_writer`: changelogs,
    derived events, retry-chain copies, and the offset with the group's generation) when
    an agent of the topic has tables, sends derived events or uses ``Retry``; the other
    offset commits go out coalesced (:mod:`streamapp.transports.kafka.commits`), once the
    batch is durable. Partitions are assigned by :mod:`streamapp.transports.kafka.assignor`
    (sticky, standby-aware, co-partitioned when an agent reads another's table); the
    standby partitions it gives are kept by :mod:`streamapp.transports.kafka.standby`.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        sink: KafkaSink,
        app_ref: str,
        history: HistoryFeed | None = None,
        metrics: TaskMetrics = NO_METRICS,
    ) -> None:
        self.app, self.settings, self.sink, self.app_ref = app, settings, sink, app_ref
        shorten_concurrent_transactions_backoff()  # batches follow each other at once
        self.history, self.metrics = history, metrics
        self.assignment = Assignment(app)
        self.lease = self.assignment.lease = Lease(settings.owner_lease())
        """Confirmed by heartbeats of this worker's generation (:mod:`.lease`)."""
        self._heartbeats = HeartbeatLease(
            settings.kafka_bootstrap, settings.group_id, self.lease, lambda: self.generation
        )
        self._topics = app.sources
        self._factory = TaskFactory(
            config=TaskConfig.from_settings(settings),
            decode=decode,
            decode_bytes=decode_bytes,
            park=lambda agent, name: parker(self.sink, agent, name),
            history=history,
            metrics=metrics,
            encode=codec.encode,
            locate=self.assignment.read_store,
            on_fatal=self._fail,
        )
        self._retention: dict[str, int] = {}
        self._admin: AIOKafkaAdminClient | None = None
        self.standbys = self.assignment.standbys = Standbys(
            app,
            settings.kafka_bootstrap,
            lambda agent, p: rocks_opener(settings, app.id, agent.name, p),
            None if history is None else history.identity,
            restoring=self._restoring,
        )
        self._promoted = PromotedStores()
        self._owned: Holdings = Holdings()
        self._lost_asked: int | None = None
        """The generation under which this worker last asked for a rebalance because a
        partition it is assigned was marked lost (:meth:`_ask_for_lost`)."""
        """What the last assignment gave this worker (its partitions)."""
        self._holdings: Holdings = Holdings()
        """What the assignor sends at a join: taken once per rebalance (:meth:`_held`)."""
        self._assignor = StickyAssignor(
            self._held,
            settings.standby_replicas,
            app.copartitioned,
            warmups=settings.standby_replicas > 0,
        )
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
            max_poll_records=settings.fetch_max_records,
            max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
            fetch_max_bytes=settings.fetch_max_bytes,
            # one assignor only: aiokafka 0.14 sends one JoinGroup per assignor offered
            # (each with the protocols so far), which keeps a group rebalancing
            partition_assignment_strategy=(self._assignor,),
        )
        self._warmup = WarmupProbe(self._consumer)
        # A revoke flushes them within a quarter of the rebalance timeout (a batch in
        # hand may take half of it).
        self._commits = OffsetCommits(
            self._consumer, min(FLUSH_TIMEOUT_S, settings.rebalance_timeout_ms / 4000)
        )
        self._worker_id = WorkerId(settings.data_dir, app.id)
        self._writer: TransactionalWriter | None = None
        """The worker's one transactional producer (made at start when a task needs it)."""
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._suspended: dict[tuple[str, int], tuple[PartitionTask, int]] = {}
        """Tasks revoked by the rebalance in progress, kept open in case it hands their
        partitions back (closed once the assignment is known), each with the generation
        of the assignment it is from."""
        self._failed: BaseException | None = None
        self.generation: Generation | None = None
        """The group generation of the current assignment (None during a rebalance):
        what the views directory trusts (:mod:`streamapp.transports.kafka.members`)."""

    async def start(self) -> None:
        """Connect (with start-up retries), check topics, join the group, start polling."""
        await with_startup_retry(  # a topic made meanwhile (topics create) is waited for
            self.settings,
            "topic check",
            lambda: check_topics(self.app, self.settings, self.app_ref),
        )
        await check_new_lanes(self.app, self.settings, self.app_ref)
        changelogs = [self.app.changelog_topic(a) for a in self.app.agents.values()]
        self._retention = await delete_retention_ms(self.settings, [t for t in changelogs if t])
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        await with_startup_retry(self.settings, "Kafka admin", admin.start)
        self._admin = admin  # reads committed offsets with their metadata
        await with_startup_retry(self.settings, "Kafka consumer", self._consumer.start)
        await with_startup_retry(self.settings, "Kafka owner's lease", self._heartbeats.start)
        deliver_records(self._consumer)  # no ConsumerRecord built per record
        if any(_transactional(self.app.agents_of(t)) for t in self._topics):
            self._writer = TransactionalWriter(
                self.settings.kafka_bootstrap,
                f"{self.app.id}-{self._worker_id.acquire()}",
                group_id=self.settings.group_id,
                timeout_s=self.settings.transaction_timeout_s,
                member=lambda: group_member(self._consumer),
                busy=self._busy,
            )
        self._consumer.subscribe(list(self._topics), listener=_Listener(self))
        self._loop_task = asyncio.create_task(self._poll_loop(), name="poll loop")

    async def stop(self) -> None:
        """Finish batches in hand, flush, commit, close stores, leave the group."""
        self._stopping = True
        if self._loop_task is not None:
            # A poll ends within poll_timeout_ms, except while a rebalance is under way:
            # aiokafka's getmany then waits for the assignment, however long it takes.
            bound = self.settings.poll_timeout_ms / 1000 + POLL_STOP_GRACE_S
            await asyncio.wait({self._loop_task}, timeout=bound)
            if not self._loop_task.done():
                log.warning("polling did not end within %.1fs (a rebalance?): cancelled", bound)
                self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._release(list(self.assignment.tasks))
        await self._close_suspended()
        await self._promoted.close()
        await self.standbys.close()
        await self._commits.close()
        await self._heartbeats.stop()
        await self._consumer.stop()
        await self._release(list(self.assignment.tasks))  # any taken during the leave
        await self._close_suspended()
        await self._promoted.close()
        if self._admin is not None:
            await self._admin.close()
        if self._writer is not None:
            await self._writer.close()
        self._worker_id.release()

    def _busy(self) -> list[TopicPartition]:
        """Source partitions whose task handles a live batch (a cycle waits for them)."""
        return [
            TopicPartition(topic, p)
            for (topic, p), task in self.assignment.tasks.items()
            if task.live_state is LiveState.HANDLING
        ]

    async def wait(self) -> None:
        """Until the poll loop ends (it raises when the consumer fails for good)."""
        if self._loop_task is not None:
            await self._loop_task
        if self._failed is not None:
            raise self._failed

    def _fail(self, exc: BaseException) -> None:
        """A partition cannot go on here (a task's :data:`~streamapp.engine.task.Fatal`):
        polling ends, so the worker stops, and its consumer leaves the group at once,
        handing the partition to another worker from its last commit."""
        if self._failed is None:
            self._failed = exc
        self._stopping = True

    async def _poll_loop(self) -> None:
        consumer, tasks = self._consumer, self.assignment.tasks
        while not self._stopping:
            if not self.assignment.rebalancing:  # standbys to take over once caught up
                self._warmup.poll(tasks.values(), self.standbys.held)
                self._ask_for_lost(tasks.values())
            try:
                fetched = await consumer.getmany(timeout_ms=self.settings.poll_timeout_ms)
            except KafkaError as exc:
                if not exc.retriable:
                    raise SourceError(f"Kafka consumer failed: {exc!r}", retriable=False) from exc
                log.warning("poll failed (%r); polling again", exc)
                await asyncio.sleep(self.settings.poll_timeout_ms / 1000)
                continue
            for tp, records in fetched.items():
                task = tasks.get((tp.topic, tp.partition))
                if task is None:  # fetched before the listener made its task
                    self._rewind_unowned(tp, position_of(records[0]))
                elif task.accepting:
                    task.feed(as_deliveries(records), prefetch=True)
                elif task.queueing:  # fetched while its batch runs: the next batch
                    task.ahead.add(as_deliveries(records))
                else:
                    task.dropped()

    def _ask_for_lost(self, tasks: Iterable[PartitionTask]) -> None:
        """A partition marked lost (its writer fenced, or its offsets refused by the
        group) that the group still assigns here: ask the group to rebalance, once per
        generation, and let the group say whose it is. Still this worker's, it opens
        again (restored from its changelog); moved, it is revoked. Without this, a
        fence the group never followed would leave the partition paused for good, as
        Kafka Streams rejoins on a task migrated."""
        if self._lost_asked == self._owned.generation:
            return
        lost = sorted(task.name for task in tasks if task.phase is Phase.LOST)
        if not lost:
            return
        self._lost_asked = self._owned.generation
        log.warning(
            "%s marked lost but still assigned here: asking the group to rebalance",
            ", ".join(lost),
        )
        request_rejoin(self._consumer)

    def _rewind_unowned(self, tp: TopicPartition, offset: int) -> None:
        try:
            self._consumer.seek(tp, offset)
        except Exception as exc:  # not assigned any more: nothing to rewind
            log.debug("%s[%d]: no rewind (%r)", tp.topic, tp.partition, exc)

    def _acquire(self, assigned: Iterable[TopicPartition], generation: int | None) -> None:
        """Start the tasks of ``assigned`` (given under ``generation``); a kept one goes on,
        without a restore when ``generation`` is the very next after its own: no other
        worker can have owned its partition in between."""
        if self._stopping:
            return
        for tp in assigned:
            topic = self._topics.get(tp.topic)
            if topic is None:
                continue
            key = (tp.topic, tp.partition)
            kept = self._suspended.pop(key, None)
            if kept is not None:
                log.debug("assigned %s[%d] again: kept open", tp.topic, tp.partition)
                task, since = kept
                self.assignment.tasks[key] = task
                task.rejoin(continuous=generation is not None and generation == since + 1)
                continue
            log.debug("assigned %s[%d]", tp.topic, tp.partition)
            task = self._task(topic, tp)
            self.assignment.tasks[key] = task
            task.start()

    def _task(self, topic: TopicSpec, tp: TopicPartition) -> PartitionTask:
        settings, app, p = self.settings, self.app, tp.partition
        name = f"{tp.topic}[{p}]"
        agents = app.agents_of(topic.name)
        transaction = None
        if _transactional(agents):
            assert self._writer is not None
            transaction = KafkaTransaction(
                settings.kafka_bootstrap,
                self._writer.transactional_id,
                tp,
                settings.group_id,
                app.changelog_topic,
                timeout_s=settings.transaction_timeout_s,
                stall_timeout_s=settings.restore_stall_timeout_s,
                retention_ms=self._retention,
                writer=self._writer,
                # revoked (the lease ended) or not assigned: never fence the owner
                assigned=lambda: self.lease.term is not None and tp in self._consumer.assignment(),
                unconfirmed=self.lease.reason,
                settled=lambda position: self._commits.settled(tp, position),
            )
        port = KafkaPartitionPort(
            self._consumer,
            tp,
            settings.auto_offset_reset,
            admin=self._admin,
            group_id=settings.group_id,
            commits=self._commits,
        )

        def open_store(agent: Agent, spaces: list[str]) -> Store:
            promoted = self._promoted.take(tp.topic, p, agent.name)
            if promoted is not None:  # its standby's, open: the tail restore follows
                log.info("%s: agent %s takes its standby's store over", name, agent.name)
                return promoted
            return rocks_opener(settings, app.id, agent.name, p)(spaces)

        return self._factory.create(
            agents, p, port, name=name, open_store=open_store, transaction=transaction
        )

    def _held(self) -> Holdings:
        """What this worker holds, for the assignor's metadata at a join: the partitions
        of its last assignment and its standbys with their lag, as of the rebalance's
        start (:meth:`revoked`). Never newer: a member that joins again with other
        metadata while the group completes a rebalance starts another one, and lags
        move all the time (a rebalance storm)."""
        return self._holdings

    def _hold(self) -> None:
        self._holdings = Holdings(self._owned.generation, self._owned.active, self.standbys.held())

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        """The group took ``revoked`` away (the rebalance listener's first half): the
        rebalance starts, the lease ends, their tasks are suspended, kept open."""
        self.assignment.rebalancing = True
        self.generation = None
        self._hold()  # before the JoinGroup: the same metadata for every try of it
        self.lease.end()
        await self._release(revoked, keep=True)
        await self._promoted.close()

    def _restoring(self) -> bool:
        """Whether a partition this worker owns is restoring (its standbys wait)."""
        return any(t.phase is Phase.RESTORING for t in self.assignment.tasks.values())

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """The group gave ``assigned`` (the rebalance listener's second half): the lease
        begins with the new generation, their tasks start (or go on), the rest close."""
        generation = current_generation(self._consumer)  # before any await
        given = self._assignor.take()
        if generation is not None:  # the assignment confirms it (the group's SyncGroup)
            self.lease.begin(generation, time.monotonic())
            self._owned = Holdings(generation.number, frozenset(assigned))
        try:
            keys = [(tp.topic, tp.partition) for tp in assigned]
            if self._stopping:  # no task opens here any more
                await self.standbys.drop(keys)
            else:  # a promoted standby's stores go over to its task open (no reopen)
                self._promoted.add(await self.standbys.promote(keys))
            # kept tasks go on where they were
            self._acquire(assigned, None if generation is None else generation.number)
        finally:
            await self._close_suspended()
        if self._stopping:
            await self._promoted.close()  # the stop began while the standbys stopped
        else:
            await self.standbys.update(given.standby - assigned)
            self._warmup.warmups = given.warmup - assigned
        self.generation = generation
        self.assignment.rebalancing = False

    async def _release(
        self, revoked: Iterable[tuple[str, int] | TopicPartition], *, keep: bool = False
    ) -> None:
        """Close the tasks of ``revoked``; with ``keep``, suspend those that can be kept
        (see :meth:`PartitionTask.suspend`) until the assignment says where they go."""
        tasks = self.assignment.tasks
        keys = [(k[0], k[1]) for k in revoked]
        taken = [(k, tasks.pop(k)) for k in keys if k in tasks]
        closing = [task for _, task in taken]
        if keep and not self._stopping:
            kept = await asyncio.gather(*(t.suspend() for t in closing), return_exceptions=True)
            for (key, task), ok in zip(taken, kept, strict=True):
                if ok is True:
                    self._suspended[key] = (task, self._owned.generation)
            closing = [task for (_, task), ok in zip(taken, kept, strict=True) if ok is not True]
        await self._close(closing)
        await self._commits.flush()  # committed while the partitions are still ours

    async def _close_suspended(self) -> None:
        """Close the kept tasks the new assignment did not hand back."""
        closing = [task for task, _ in self._suspended.values()]
        self._suspended.clear()
        await self._close(closing)

    async def _close(self, closing: list[PartitionTask]) -> None:
        results = await asyncio.gather(*(t.close() for t in closing), return_exceptions=True)
        for task, result in zip(closing, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing %s failed: %r", task.name, result)


def _transactional(agents: Iterable[Agent]) -> bool:
    """Whether the tasks of these agents' topic commit in transactions."""
    return any(a.tables or a.sinks or isinstance(a.on_failure, Retry) for a in agents)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Runs in the group coordinator: awaits only self-contained work (see PITFALLS.md)."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.source.revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.source.assigned(assigned)


def current_generation(consumer: AIOKafkaConsumer) -> Generation | None:
    """The generation and member id of ``consumer``'s assignment, read in the assignment
    callback. aiokafka keeps them on its group coordinator only (``generation``,
    ``member_id``, set by the JoinGroup it completed), with no public accessor."""
    member = group_member(consumer)
    if member is None:
        log.warning("the group generation is not known: views do not forward until it is")
        return None
    return Generation(member.generation_id, member.member_id)


def group_member(consumer: AIOKafkaConsumer) -> Member | None:
    """``consumer``'s generation and member id as its group coordinator holds them now
    (None: not a member, e.g. removed from the group and not joined again): what a
    transaction's offsets are committed with."""
    coordinator = getattr(consumer, "_coordinator", None)
    number = getattr(coordinator, "generation", None)
    member_id = getattr(coordinator, "member_id", None)
    if not isinstance(number, int) or number < 0 or not isinstance(member_id, str):
        return None
    if not member_id:
        return None
    return Member(number, member_id)
