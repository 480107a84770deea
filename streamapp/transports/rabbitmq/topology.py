"""The RabbitMQ shape of a topic: a direct exchange and one queue per partition.

A topic ``T`` with ``N`` partitions is the durable direct exchange ``T`` and the durable
classic queues ``T.0`` .. ``T.{N-1}``, each bound with routing key ``"p"`` and declared
with ``x-single-active-consumer`` (the broker lets one consumer at a time receive from a
partition, whatever the workers believe). Parking destinations, the retry chain's
``{topic}-retry`` and ``{topic}-dlq`` and, with ``delayed_policy=relay``, the
``{topic}-delay`` topics are made the same way (the relay, :mod:`.relay`, consumes the
retry and delay queues).

Routing is computed by the publisher (:func:`streamapp.topics.partition_for`, Kafka's
murmur2 over the stream id), not by a consistent-hash exchange: the plugin's hash is the
broker's, clients cannot compute it, and old versions could route a key elsewhere after
a restart; views and the table write check must know a key's partition, and every
transport must agree on it (see PITFALLS.md). The routing key is the partition number.

Classic queues: quorum queues on RabbitMQ 4 drop a message after 20 redeliveries unless
declared with ``x-delivery-limit`` (PITFALLS.md); a quorum option must declare it.

The app's workers form their group over the durable fanout exchange ``{app}-members``
(:mod:`.members`), made here too.

Dead-letter and parking topics may have any number of partition queues (made by hand,
e.g. one): the worker counts them (:func:`chain_queue_counts`) and the sink routes
copies by key over those. Only ``streamapp topics create`` declares; a worker checks
with passive declares and names what is missing and the command that makes it.
"""

from __future__ import annotations

import logging
from typing import Any

from aio_pika.abc import AbstractConnection, ExchangeType
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from ...app import App
from ...errors import ConfigError, MissingTopicError
from ...settings.settings import Settings
from ...topics import TopicPlan, TopicRole
from .connection import connect
from .members import members_exchange

log = logging.getLogger("streamapp.rabbitmq")

QUEUE_ARGUMENTS: dict[str, Any] = {"x-queue-type": "classic", "x-single-active-consumer": True}


def queue_name(topic: str, partition: int) -> str:
    """The queue of ``topic``'s ``partition``."""
    return f"{topic}.{partition}"


def plans(app: App, delayed_policy: str = "immediate") -> list[TopicPlan]:
    """What the app needs on RabbitMQ: source, output, parking, retry, dead-letter and
    (``delayed_policy=relay``) delay topics. No changelogs: state is restored by the
    event-store replay; no members topic: that is Kafka's directory of view owners,
    RabbitMQ's comes with its membership protocol."""
    skipped = (TopicRole.CHANGELOG, TopicRole.MEMBERS)
    return [p for p in app.topic_plan(delayed_policy) if p.role not in skipped]


async def create_topology(app: App, settings: Settings) -> list[str]:
    """Declare every exchange and partition queue of the app that is missing; returns the
    topics that had something missing (``streamapp topics create`` refused an app that
    RabbitMQ cannot run before: :func:`streamapp.transports.base.refuse_unsupported`)."""
    connection = await connect(settings)
    created: list[str] = []
    try:
        for plan in plans(app, settings.delayed_policy):
            missing = await _missing(connection, plan)
            if not missing or (plan.role in ANY_COUNT and await _has_one(connection, plan)):
                continue  # a dead-letter or parking topic made with fewer queues is kept
            channel = await connection.channel()
            exchange = await channel.declare_exchange(plan.name, ExchangeType.DIRECT, durable=True)
            for p in range(plan.partitions):
                queue = await channel.declare_queue(
                    queue_name(plan.name, p), durable=True, arguments=QUEUE_ARGUMENTS
                )
                await queue.bind(exchange, routing_key=str(p))
            await channel.close()
            created.append(plan.name)
            log.info("declared exchange %s and %d queues", plan.name, plan.partitions)
        members = members_exchange(app)
        if not await _exists(connection, exchange=members):
            channel = await connection.channel()
            await channel.declare_exchange(members, ExchangeType.FANOUT, durable=True)
            await channel.close()
            created.append(members)
            log.info("declared the group's exchange %s", members)
    finally:
        await connection.close()
    return created


async def check_topology(
    connection: AbstractConnection, app: App, app_ref: str, delayed_policy: str = "immediate"
) -> None:
    """Raise MissingTopicError naming every missing exchange or queue (retry, dead-letter
    and delay topics included), ConfigError when a topic has more partition queues than
    the app declares."""
    missing: list[str] = []
    members = members_exchange(app)
    if not await _exists(connection, exchange=members):
        missing.append(f"exchange {members}")
    for plan in plans(app, delayed_policy):
        if plan.role in ANY_COUNT:  # checked by chain_queue_counts
            continue
        missing += await _missing(connection, plan)
        extra = queue_name(plan.name, plan.partitions)
        if await _exists(connection, queue=extra):
            raise ConfigError(
                f"queue {extra!r} exists but topic {plan.name!r} is declared with "
                f"{plan.partitions} partitions: the partition counts must match (routing is "
                "by partition number). Declare the partition count they were made with, or "
                "re-partition: stop every worker of the app, run `streamapp reset -A "
                f"{app_ref} --yes` (the state is split by the old count), delete the topic's "
                "exchange and queues, make them with `STREAMAPP_BROKER=rabbitmq streamapp "
                f"topics create -A {app_ref}`, and start again."
            )
    for plan in plans(app, delayed_policy):
        if plan.role in ANY_COUNT:  # at least one partition queue
            if not await _exists(connection, exchange=plan.name):
                missing.append(f"exchange {plan.name}")
            if not await _exists(connection, queue=queue_name(plan.name, 0)):
                missing.append(f"queue {queue_name(plan.name, 0)}")
    if missing:
        raise MissingTopicError(  # names are "exchange X" / "queue X.p"
            missing,
            app_ref,
            message=f"{', '.join(sorted(missing))} missing on RabbitMQ; streamapp never "
            "auto-creates them. Create them with `STREAMAPP_BROKER=rabbitmq streamapp topics "
            f"create -A {app_ref}`.",
        )


ANY_COUNT = (TopicRole.DEAD_LETTER, TopicRole.PARKING)
"""Roles whose topics may have any number of partition queues: nothing reads them by
partition number, copies are routed by key over the queues they have."""


async def chain_queue_counts(
    connection: AbstractConnection, app: App, delayed_policy: str = "immediate"
) -> dict[str, int]:
    """The partition queues each dead-letter and parking topic has (``T.0`` .. up to the
    first missing one), for the sink's routing. Retry and delay topics keep the source's
    count (:func:`check_topology`)."""
    counts: dict[str, int] = {}
    for plan in plans(app, delayed_policy):
        if plan.role not in ANY_COUNT:
            continue
        n = 0
        while await _exists(connection, queue=queue_name(plan.name, n)):
            n += 1
        counts[plan.name] = max(n, 1)
    return counts


async def _has_one(connection: AbstractConnection, plan: TopicPlan) -> bool:
    """The topic's exchange and its first partition queue exist."""
    exchange = await _exists(connection, exchange=plan.name)
    return exchange and await _exists(connection, queue=queue_name(plan.name, 0))


async def _missing(connection: AbstractConnection, plan: TopicPlan) -> list[str]:
    missing: list[str] = []
    if not await _exists(connection, exchange=plan.name):
        missing.append(f"exchange {plan.name}")
    for p in range(plan.partitions):
        name = queue_name(plan.name, p)
        if not await _exists(connection, queue=name):
            missing.append(f"queue {name}")
    return missing


async def _exists(
    connection: AbstractConnection, *, exchange: str | None = None, queue: str | None = None
) -> bool:
    """A passive declare on a channel of its own (a 404 closes the channel)."""
    channel = await connection.channel()
    try:
        if exchange is not None:
            await channel.declare_exchange(exchange, passive=True)
        if queue is not None:
            await channel.declare_queue(queue, passive=True)
        return True
    except ChannelNotFoundEntity:
        return False
    except ChannelPreconditionFailed as exc:
        raise ConfigError(f"RabbitMQ refused a passive declare: {exc}") from exc
    finally:
        if not channel.is_closed:
            await channel.close()
