"""Admin calls ``streamapp reset`` makes on Kafka: who is in the app's group, which
workers the members topic names, and changelog topics deleted and made again empty."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from ...errors import SourceError
from ...settings.settings import Settings
from ...topics import TopicPlan
from ...versions.ledger import PREFIX as LEDGER_PREFIX
from .connection import with_startup_retry
from .topology import partition_counts

TOPIC_TIMEOUT_S = 60.0
"""How long a deleted topic may take to disappear and be made again."""


@dataclass(frozen=True, slots=True)
class GroupMember:
    """An active member of a consumer group, as the group coordinator describes it."""

    member_id: str
    client_id: str
    host: str
    partitions: frozenset[tuple[str, int]]


async def group_members(settings: Settings, group_id: str) -> list[GroupMember]:
    """The active members of ``group_id`` (none when the group is empty or unknown)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "Kafka admin", admin.start)
        responses = await admin.describe_consumer_groups([group_id])
    except KafkaError as exc:
        raise SourceError(f"describing consumer group {group_id!r} failed: {exc!r}") from exc
    finally:
        await admin.close()
    out: list[GroupMember] = []
    for response in responses:
        for group in response.to_object()["groups"]:
            for member in group["members"]:
                out.append(
                    GroupMember(
                        member["member_id"],
                        member["client_id"],
                        member["client_host"].lstrip("/"),
                        _assigned(member["member_assignment"]),
                    )
                )
    return out


def _assigned(raw: bytes | None) -> frozenset[tuple[str, int]]:
    if not raw:
        return frozenset()
    try:
        decoded = ConsumerProtocolMemberAssignment.decode(raw)
    except Exception:  # another protocol's assignment: no partitions to show
        return frozenset()
    return frozenset((tp.topic, tp.partition) for tp in decoded.partitions())


async def member_records(settings: Settings, topic: str) -> dict[str, dict[str, Any]]:
    """The records on the members topic ``topic`` that no tombstone ended, by worker id
    (a worker killed with SIGKILL leaves its record: match it with the group)."""
    if not (await partition_counts(settings, [topic])).get(topic):
        return {}  # no members topic (made by an older streamapp)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False
    )
    tp = TopicPartition(topic, 0)
    records: dict[str, dict[str, Any]] = {}
    try:
        await with_startup_retry(settings, "Kafka consumer", consumer.start)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + TOPIC_TIMEOUT_S
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                for record in batch:
                    _apply_record(records, record.key, record.value)
    except KafkaError as exc:
        raise SourceError(f"reading topic {topic!r} failed: {exc!r}") from exc
    finally:
        await consumer.stop()
    return records


def _apply_record(
    records: dict[str, dict[str, Any]], key: bytes | None, value: bytes | None
) -> None:
    if key is None:
        return
    worker = key.decode(errors="replace")
    if worker.startswith(LEDGER_PREFIX):
        return  # a ledger record (streamapp.transports.kafka.ledger), not a worker's
    if value is None:
        records.pop(worker, None)
        return
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return
    if isinstance(body, dict):
        records[worker] = body


async def recreate_topics(settings: Settings, plans: Sequence[TopicPlan]) -> dict[str, bool]:
    """Delete the topics of ``plans``, wait until they are gone, then create them again,
    empty, as ``streamapp topics create`` makes them. Returns, by topic, whether it
    existed (and so was deleted)."""
    if not plans:
        return {}
    names = [p.name for p in plans]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "Kafka admin", admin.start)
        existed = set(await admin.list_topics()) & set(names)
        if existed:
            response = await admin.delete_topics(sorted(existed))
            for name, code in response.topic_error_codes:
                if code and code != UnknownTopicOrPartitionError.errno:
                    raise SourceError(
                        f"deleting topic {name!r} failed with Kafka error code {code}; "
                        "check that topic deletion is enabled (delete.topic.enable) and allowed"
                    )
        deadline = time.monotonic() + TOPIC_TIMEOUT_S
        await _wait_gone(admin, sorted(existed), deadline)
        await _create(admin, settings, plans, existed, deadline)
    except KafkaError as exc:
        raise SourceError(f"re-creating topics {names} failed: {exc!r}") from exc
    finally:
        await admin.close()
    return {name: name in existed for name in names}


async def delete_topics(settings: Settings, names: Sequence[str]) -> dict[str, bool]:
    """Delete the topics ``names`` and wait until they are gone; by topic, whether it
    existed (and so was deleted)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "Kafka admin", admin.start)
        existed = sorted(set(await admin.list_topics()) & set(names))
        if existed:
            response = await admin.delete_topics(existed)
            for name, code in response.topic_error_codes:
                if code and code != UnknownTopicOrPartitionError.errno:
                    raise SourceError(
                        f"deleting topic {name!r} failed with Kafka error code {code}; "
                        "check that topic deletion is enabled (delete.topic.enable) and allowed"
                    )
        await _wait_gone(admin, existed, time.monotonic() + TOPIC_TIMEOUT_S)
    except KafkaError as exc:
        raise SourceError(f"deleting topics {list(names)} failed: {exc!r}") from exc
    finally:
        await admin.close()
    return {name: name in existed for name in names}


async def existing_topics(settings: Settings, names: Sequence[str]) -> set[str]:
    """The topics among ``names`` that exist."""
    return {n for n, count in (await partition_counts(settings, list(names))).items() if count}


async def _wait_gone(admin: AIOKafkaAdminClient, names: list[str], deadline: float) -> None:
    while names:
        present = set(await admin.list_topics())
        names = [n for n in names if n in present]
        if not names:
            return
        if time.monotonic() > deadline:
            raise SourceError(
                f"topics {names} still exist {TOPIC_TIMEOUT_S:.0f}s after their deletion; "
                "run `streamapp reset` again once Kafka has removed them"
            )
        await asyncio.sleep(0.2)


async def _create(
    admin: AIOKafkaAdminClient,
    settings: Settings,
    plans: Sequence[TopicPlan],
    deleted: set[str],
    deadline: float,
) -> None:
    """Create ``plans``; a deleted topic the broker still has is "already there": try
    again (one made meanwhile by someone else is kept)."""
    pending = list(plans)
    while pending:
        new = [
            NewTopic(
                p.name,
                p.partitions,
                settings.replication_factor,
                topic_configs={"cleanup.policy": "compact"} if p.compacted else {},
            )
            for p in pending
        ]
        response = await admin.create_topics(new)
        retry: list[str] = []
        for name, code, *_ in response.topic_errors:
            if code == TopicAlreadyExistsError.errno:
                if name in deleted:
                    retry.append(name)
            elif code:
                raise SourceError(f"creating topic {name!r} failed with Kafka error code {code}")
        pending = [p for p in pending if p.name in retry]
        if pending and time.monotonic() > deadline:
            raise SourceError(
                f"topics {[p.name for p in pending]} could not be made again within "
                f"{TOPIC_TIMEOUT_S:.0f}s of their deletion; create them with "
                "`streamapp topics create`"
            )
        if pending:
            await asyncio.sleep(0.5)
