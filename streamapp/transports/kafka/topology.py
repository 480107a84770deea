"""Creating and checking the topics an app needs. Never auto-created by a worker."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from ...agents.agent import Agent
from ...app import App
from ...errors import ConfigError, MissingTopicError
from ...settings.settings import Settings
from ...topics import TopicPlan, TopicRole
from .connection import with_startup_retry

log = logging.getLogger("streamapp.kafka.topology")


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
        await _until_visible(admin, {p.name: p.partitions for p in missing})
        return [p.name for p in missing]
    finally:
        await admin.close()


VISIBLE_POLLS = 200
"""Metadata reads while created topics become visible (about 20 s at most)."""


async def _until_visible(admin: AIOKafkaAdminClient, wanted: dict[str, int]) -> None:
    """Return once the broker's metadata shows each created topic with all its
    partitions led: CreateTopics answers when the controller made them, and a worker
    started right after would otherwise see them missing and retry. A topic still not
    visible after :data:`VISIBLE_POLLS` reads is logged; the worker's topic check then
    retries as for a topic made by someone else."""
    pending = dict(wanted)
    for _ in range(VISIBLE_POLLS):
        described = await admin.describe_topics(list(pending))
        for d in described:
            parts = d["partitions"]
            led = [p for p in parts if p["error_code"] == 0 and p["leader"] >= 0]
            if d["error_code"] == 0 and len(led) == pending.get(d["topic"], -1):
                pending.pop(d["topic"], None)
        if not pending:
            return
        await asyncio.sleep(0.1)
    log.warning(
        "topic(s) %s created but not yet in the broker's metadata; a worker started now "
        "retries its topic check until they are",
        ", ".join(sorted(pending)),
    )


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
                "and re-keyed events are routed by the declared count, so these must match. "
                f"Declare partitions={have} again, or re-partition: stop every worker of the "
                f"app, run `streamapp reset -A {app_ref} --yes` (it removes the local state "
                "and the changelogs), delete the other topics whose count changes, make them "
                f"with `streamapp topics create -A {app_ref}`, and start again."
            )
    check_chain_topics(plan, partitions)


async def check_new_lanes(app: App, settings: Settings, app_ref: str) -> None:
    """Refuse a new agent without history (its changelog empty) beside agents of its
    topic that hold state already, unless the topic keeps every record: its lane is
    then built from the topic's earliest offset (the live lanes skip what they did).
    On a topic that deletes or compacts records the new table would silently lack
    everything the topic no longer holds."""
    for topic, agents in _stateful_by_topic(app).items():
        fresh = [a for a in agents if a.history is None]
        if not fresh or len(agents) < 2:
            continue
        sizes = await _sizes(settings, [app.changelog_topic(a) or "" for a in agents])
        sized = {a.name: sizes.get(app.changelog_topic(a) or "", 0) for a in agents}
        new = [a.name for a in fresh if not sized[a.name]]
        if not new or not any(sized[a.name] for a in agents if a.name not in new):
            continue
        keeps = await topic_configs(settings, [topic], ("retention.ms", "cleanup.policy"))
        retention = keeps.get(topic, {}).get("retention.ms", "unknown")
        policy = keeps.get(topic, {}).get("cleanup.policy", "unknown")
        if "compact" not in policy and (retention == "-1" or await _from_start(settings, topic)):
            continue  # it holds every record written to it: the lane is built from them
        raise ConfigError(
            f"agent(s) {new} of topic {topic!r} are new (empty changelog) and declare no "
            f"history, beside agents of that topic with state: their tables would be built "
            f"from what topic {topic!r} still holds, but it keeps records for "
            f"retention.ms={retention} (cleanup.policy={policy}), so earlier events are "
            f"gone. Declare history=FromEventStore() on them (built from the event store), "
            f"or make the topic keep everything (retention.ms=-1, cleanup.policy=delete) "
            f"if it still holds every record, then start again (`streamapp worker -A "
            f"{app_ref}`)"
        )


async def _from_start(settings: Settings, topic: str) -> bool:
    """True while ``topic`` still holds its first record in every partition (no record
    deleted by retention yet): e.g. one agent rebuilt by ``streamapp reset --agent``."""
    counts = await partition_counts(settings, [topic])
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "topic start offsets", consumer.start)
        tps = [TopicPartition(topic, p) for p in range(counts.get(topic, 0))]
        starts = await consumer.beginning_offsets(tps) if tps else {}
    finally:
        await consumer.stop()
    return bool(starts) and all(int(offset) == 0 for offset in starts.values())


def _stateful_by_topic(app: App) -> dict[str, list[Agent]]:
    out: dict[str, list[Agent]] = {}
    for agent in app.agents.values():
        if agent.tables:
            out.setdefault(agent.topic.name, []).append(agent)
    return out


async def _sizes(settings: Settings, names: list[str]) -> dict[str, int]:
    """Records ever written to each topic among ``names`` (sum of its end offsets)."""
    counts = await partition_counts(settings, names)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await with_startup_retry(settings, "changelog sizes", consumer.start)
        tps = [TopicPartition(n, p) for n, c in counts.items() for p in range(c)]
        ends = await consumer.end_offsets(tps) if tps else {}
    finally:
        await consumer.stop()
    out: dict[str, int] = {}
    for tp, end in ends.items():
        out[tp.topic] = out.get(tp.topic, 0) + int(end)
    return out


async def topic_configs(
    settings: Settings, names: list[str], keys: tuple[str, ...]
) -> dict[str, dict[str, str]]:
    """The configs ``keys`` of each topic among ``names`` that reports them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    out: dict[str, dict[str, str]] = {}
    try:
        await with_startup_retry(settings, "topic configs", admin.start)
        wanted = dict.fromkeys(keys)
        resources = [ConfigResource(ConfigResourceType.TOPIC, n, wanted) for n in names]
        for response in await admin.describe_configs(resources):
            for _code, _msg, _type, name, entries in response.resources:
                for entry in entries:
                    if entry[0] in keys and entry[1] is not None:
                        out.setdefault(name, {})[entry[0]] = str(entry[1])
    finally:
        await admin.close()
    return out


def check_chain_topics(plan: list[TopicPlan], partitions: dict[str, int]) -> None:
    """Raise ConfigError when a retry or delay topic's partition count differs from its
    origin's: the lane copies a failed record to its own partition number of
    ``{topic}-retry``, and each relay partition is paced on its own. Dead-letter and
    parking topics may have any count (copies are routed by key over their partitions)."""
    for p in plan:
        have = partitions.get(p.name)
        if p.role in (TopicRole.RETRY, TopicRole.DELAY) and have not in (None, p.partitions):
            raise ConfigError(
                f"{p.role} topic {p.name!r} has {have} partitions but the topic it "
                f"holds copies for has {p.partitions}; copies keep their partition "
                f"number, so the counts must match: delete {p.name!r} and make it "
                f"with {p.partitions} partitions (streamapp topics create)"
            )


_COUNTED = (TopicRole.SOURCE, TopicRole.CHANGELOG, TopicRole.OUTPUT, TopicRole.REPARTITION)
