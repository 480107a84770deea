"""Creating and checking the topics an app needs. Never auto-created by a worker."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from ..app import App, TopicRole
from ..errors import ConfigError, MissingTopicError
from ..settings import Settings
from .retry import with_startup_retry

log = logging.getLogger(__name__)


async def create_topics(app: App, settings: Settings) -> list[str]:
    """Create every topic of ``app.topic_plan()`` that is missing; returns those created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    replication_factor = settings.replication_factor
    try:
        await with_startup_retry(settings, "topic admin", admin.start)
        existing = set(await admin.list_topics())
        missing = [p for p in app.topic_plan(settings.delayed_policy) if p.name not in existing]
        if not missing:
            return []
        new = [
            NewTopic(
                p.name,
                p.partitions,
                replication_factor,
                topic_configs={"cleanup.policy": "compact"} if p.compacted else {},
            )
            for p in missing
        ]
        resp = await admin.create_topics(new)
        for name, code, *_ in resp.topic_errors:
            if code and code != TopicAlreadyExistsError.errno:
                raise ConfigError(f"creating topic {name!r} failed with Kafka error code {code}")
        return [p.name for p in missing]
    finally:
        await admin.close()


async def partition_counts(settings: Settings, names: list[str]) -> dict[str, int]:
    """Partition count of each existing topic among ``names`` (missing ones are absent)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "topic check", admin.start)
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}


async def delete_retention_ms(settings: Settings, names: list[str]) -> dict[str, int]:
    """``delete.retention.ms`` of each topic among ``names`` that reports it."""
    if not names:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    out: dict[str, int] = {}
    try:
        await with_startup_retry(settings, "topic configs", admin.start)
        wanted = {"delete.retention.ms": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, n, wanted) for n in names]
        for response in await admin.describe_configs(resources):
            for _code, _msg, _type, name, entries in response.resources:
                for entry in entries:
                    if entry[0] == "delete.retention.ms" and entry[1] is not None:
                        out[name] = int(entry[1])
    finally:
        await admin.close()
    return out


async def check_topics(app: App, settings: Settings, app_ref: str) -> None:
    """Raise when a needed topic is missing or a changelog is partitioned unlike its source."""
    plan = app.topic_plan(settings.delayed_policy)
    partitions = await partition_counts(settings, [p.name for p in plan])
    # Without the members topic (made by an older streamapp) views do not forward.
    missing = [
        p.name for p in plan if not partitions.get(p.name) and p.role is not TopicRole.MEMBERS
    ]
    if missing:
        raise MissingTopicError(missing, app_ref)
    for p in plan:
        have = partitions[p.name]
        if p.role in _COUNTED and have != p.partitions:
            raise ConfigError(
                f"topic {p.name!r} has {have} partitions but the app declares {p.partitions} "
                f"({p.role}); tables are partitioned like their source and derived events "
                "and re-keyed events are routed by the declared count, so these must match"
            )


_COUNTED = (TopicRole.SOURCE, TopicRole.CHANGELOG, TopicRole.OUTPUT, TopicRole.REPARTITION)
