"""Group membership for views: who owns which partition, and where its views answer.

Each worker writes one record, keyed by its id, to the compacted ``{app}-members`` topic
(made by ``streamapp topics create``): its views URL, the partitions it owns, and the
group generation (and member id) under which the group assigned them. Every worker
reads the topic from the start and follows it, and rewrites its record after every
rebalance. Kafka's group decides ownership, so the directory believes only records of
this worker's own generation, the current one as the group told it, and (once a
DescribeGroups after each rebalance has named them) of the group's current members: a
worker that died or left stays at an older generation, or is no member (a leftover of
a group made again, whose generations count from 1 again), and is never routed to.
Until the new owner's record arrives the owner is unknown (views answer 503 +
Retry-After). No wall clock is compared. A clean stop writes a tombstone. A wrong
guess is still safe: a worker asked for a partition it does not own answers 421, which
the asking worker turns into 503.

A record also says which table versions the worker's code declares, which of its
partitions each version has live, and the version it answers each table from
(:func:`streamapp.engine.served.local_tables`); the worker rewrites it whenever that
changes (a lane goes live), not only after rebalances. A record without them (an older
streamapp) declares version 1 of each table, live where it owns the partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ...app import App
from ...engine.assignment import Assignment
from ...engine.interfaces import Sink
from ...engine.served import local_tables, old_declared
from ...errors import PublishError
from ...settings.settings import Settings
from ...versions.ledger import PREFIX as LEDGER_PREFIX
from ...versions.states import MemberTables, encode_member, parse_member
from .topology import partition_counts

log = logging.getLogger("streamapp.members")

TICK_S = 0.2
"""How often a worker compares its partitions with what it last wrote."""
TOMBSTONE_TIMEOUT_S = 5.0
"""How long a leaving worker tries to write its tombstone (a bound on the stop)."""
REFRESH_S = 30.0
"""A worker rewrites its record this often even when nothing changed."""
PROGRESS_S = 1.0
"""A record whose only change is a replay's progress is rewritten at most this often."""
DESCRIBE_RETRY_S = 1.0
"""How soon a DescribeGroups that failed (or found the group rebalancing) is asked again."""


@dataclass(frozen=True, slots=True)
class Generation:
    """The consumer group generation of this worker's current assignment."""

    number: int
    member_id: str


@dataclass(frozen=True, slots=True)
class Claim:
    """One worker's record: where its views answer, what it owns, under which generation."""

    url: str
    generation: int
    member_id: str
    partitions: frozenset[tuple[str, int]]


def parse_claim(record: Any) -> Claim | None:
    """The claim of a record (None: a record without a generation, of an older streamapp
    that compared wall clocks, or not a record at all: never routed to)."""
    if not isinstance(record, dict):
        return None
    try:
        url, generation = record["url"], record["generation"]
        member_id = record.get("member_id", "")
        partitions = frozenset((str(t), int(p)) for t, p, *_ in record.get("partitions", ()))
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(url, str) or not url or not isinstance(generation, int):
        return None
    return Claim(url, generation, str(member_id), partitions)


def stable_member_ids(described: Any, group_id: str) -> frozenset[str] | None:
    """The member ids of ``group_id`` in a DescribeGroups response (any version: member
    id first in each member), when the group is stable; None otherwise."""
    for group in getattr(described, "groups", ()):
        error_code, name, state, members = group[0], group[1], group[2], group[5]
        if name == group_id and error_code == 0 and state == "Stable":
            return frozenset(str(m[0]) for m in members)
    return None


class KafkaMembers:
    """This worker's membership record, and everyone's, as a views directory."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        assignment: Assignment,
        worker_id: str,
        sink: Sink,
        generation: Callable[[], Generation | None],
    ) -> None:
        self.app, self.settings, self.assignment = app, settings, assignment
        self.worker_id, self.sink = worker_id, sink
        self.generation = generation
        """This worker's generation (None: between a revoke and the next assignment)."""
        self.topic = app.members_topic
        self.url = ""
        self.members: dict[str, Claim] = {}
        """Every other worker's last record, by worker id."""
        self.tables: dict[str, MemberTables] = {}
        """Every other worker's table versions, from the same records."""
        self._trusted: list[MemberTables] | None = None
        """The table versions of the members last trusted (kept between generations)."""
        self._end = 0
        """The topic's end when this worker began reading it: read up to it, the
        directory knows what the members wrote before this worker came."""
        self.read_up = False
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self.current: tuple[int, frozenset[str]] | None = None
        """The group's member ids, described under this worker's generation (number)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._written: tuple[Generation, frozenset[tuple[str, int]], MemberTables, float] | None = (
            None
        )

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
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        await admin.start()
        self._admin = admin  # closed by stop(), also when the start fails below
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            enable_auto_commit=False,
            client_id=f"{self.app.id}-members",
        )
        await consumer.start()
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        self._end = (await consumer.end_offsets([tp]))[tp]
        self.read_up = self._end == 0
        self._consumer = consumer
        self._tasks = [
            asyncio.create_task(self._read(), name="members reader"),
            asyncio.create_task(self._write(), name="members writer"),
            asyncio.create_task(self._describe(admin), name="members describer"),
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
        if self._admin is not None:
            await self._admin.close()

    # Directory ------------------------------------------------------------------------
    def owner_url(self, topic: str, partition: int) -> str | None:
        """The URL of the member that claims ``topic[partition]`` under this worker's own
        generation (and is in the group, once described); None when none does (yet), or
        when two do (views answer 503 until the description or a rebalance settles it)."""
        own = self.generation()
        if own is None:
            return None
        current = self.current
        members = current[1] if current is not None and current[0] == own.number else None
        owners = {
            c.url
            for c in self.members.values()
            if c.generation == own.number
            and (topic, partition) in c.partitions
            and (members is None or c.member_id in members)
        }
        return owners.pop() if len(owners) == 1 else None

    def member_tables(self) -> list[MemberTables] | None:
        """The table versions of the members :meth:`owner_url` trusts (between a revoke
        and the next assignment: those last trusted); None until the topic is read."""
        if not self.read_up:
            return None
        own = self.generation()
        if own is None:
            return self._trusted
        current = self.current
        members = current[1] if current is not None and current[0] == own.number else None
        self._trusted = [
            self.tables[worker]
            for worker, c in sorted(self.members.items())
            if c.generation == own.number
            and (members is None or c.member_id in members)
            and worker in self.tables
        ]
        return self._trusted

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
            if not self.read_up:
                tp = TopicPartition(self.topic, 0)
                self.read_up = await consumer.position(tp) >= self._end

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        worker = key.decode(errors="replace")
        if worker == self.worker_id or worker.startswith(LEDGER_PREFIX):
            return  # the ledger's records: streamapp.transports.kafka.ledger reads them
        if value is None:
            self.members.pop(worker, None)
            self.tables.pop(worker, None)
            return
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            record = None
        claim = parse_claim(record)
        tables = None
        if claim is not None:
            tables = parse_member(worker, record, old_declared(self.app, claim.partitions))
        if claim is None or tables is None:
            log.warning(
                "%s: record of %s is not one this streamapp reads; ignored", self.topic, worker
            )
            self.members.pop(worker, None)
            self.tables.pop(worker, None)
            return
        self.members[worker] = claim
        self.tables[worker] = tables

    async def _describe(self, admin: AIOKafkaAdminClient) -> None:
        """One DescribeGroups per generation of this worker: who the members are."""
        while True:
            own = self.generation()
            if own is None or (self.current is not None and self.current[0] == own.number):
                await asyncio.sleep(TICK_S)
                continue
            try:
                described = await admin.describe_consumer_groups([self.settings.group_id])
            except KafkaError as exc:
                log.info("describing group %s failed (%r); again", self.settings.group_id, exc)
                described = []
            ids = next(
                (m for d in described if (m := stable_member_ids(d, self.settings.group_id))),
                None,
            )
            if ids is not None and self.generation() == own:
                self.current = (own.number, ids)
                continue
            await asyncio.sleep(DESCRIBE_RETRY_S)

    async def _write(self) -> None:
        while True:
            generation = self.generation()
            if generation is not None and not self.assignment.rebalancing:
                owned = frozenset(self.assignment.tasks)
                tables = local_tables(self.assignment, self.worker_id)
                if self._due(generation, owned, tables):
                    try:
                        await self._publish(generation, owned, tables)
                        self._written = (generation, owned, tables, time.monotonic())
                    except PublishError as exc:
                        log.warning("writing to %s failed (%r); trying again", self.topic, exc)
            await asyncio.sleep(TICK_S)

    def _due(
        self, generation: Generation, owned: frozenset[tuple[str, int]], tables: MemberTables
    ) -> bool:
        """Whether this worker's record is to be written again now: never written, old,
        its generation, partitions, live lanes or latches changed, or its progress
        (at most every :data:`PROGRESS_S`)."""
        last, now = self._written, time.monotonic()
        if last is None or now - last[3] > REFRESH_S or last[:2] != (generation, owned):
            return True
        if _phases(last[2]) != _phases(tables):
            return True
        return last[2] != tables and now - last[3] >= PROGRESS_S

    async def _publish(
        self, generation: Generation, owned: frozenset[tuple[str, int]], tables: MemberTables
    ) -> None:
        record = {
            **encode_member(tables),
            "worker": self.worker_id,
            "url": self.url,
            "generation": generation.number,
            "member_id": generation.member_id,
            "partitions": [[t, p] for t, p in sorted(owned)],
        }
        await self.sink.publish(self.topic, orjson.dumps(record), key=self.worker_id.encode())


def _phases(tables: MemberTables) -> object:
    """What a record says of live partitions and latches, its progress left out."""
    return [(d.table, d.version, d.live) for d in tables.declared], dict(tables.serving)
