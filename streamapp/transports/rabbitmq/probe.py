"""Who runs an app on RabbitMQ, asked of the broker (for ``streamapp reset``).

Two looks, because a worker shows itself in two ways: members of the group beat on the
``{app}-members`` fanout exchange (:mod:`.members`), so listening there for one
session timeout hears every live member; a worker with pinned partitions
(``amqp_partitions``) does not beat, but consumes its partition queues, whose consumer
counts a passive declare reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity

from ...app import App
from ...errors import SourceError
from ...settings.settings import Settings
from .connection import connect, safe_url
from .members import members_exchange
from .topology import queue_name


@dataclass(frozen=True, slots=True)
class HeardMember:
    """A member heard beating on the members exchange."""

    member_id: str
    url: str | None
    held: tuple[tuple[str, int], ...]


async def running(
    app: App, settings: Settings, queues: Sequence[str]
) -> tuple[list[HeardMember], dict[str, int]]:
    """The members heard within ``amqp_session_timeout_ms``, and the queues among
    ``queues`` that have consumers (with their counts)."""
    connection = await connect(settings, "streamapp reset", robust=False)
    try:
        heard = await _listen(connection, app, settings.amqp_session_timeout_ms / 1000)
        consumers = await _consumers(connection, queues)
    except (AMQPError, OSError) as exc:
        raise SourceError(
            f"asking RabbitMQ at {safe_url(settings.amqp_url)} who runs app {app.id!r} "
            f"failed: {exc!r}"
        ) from exc
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return heard, consumers


async def _listen(connection: AbstractConnection, app: App, window_s: float) -> list[HeardMember]:
    """Members beating on the app's exchange; returns at the first one heard."""
    name = members_exchange(app)
    channel = await connection.channel()
    try:
        exchange = await channel.get_exchange(name, ensure=True)
    except ChannelNotFoundEntity:
        return []  # no exchange: no member could have joined
    queue = await channel.declare_queue(
        f"{name}.reset-{uuid.uuid4().hex[:8]}", exclusive=True, auto_delete=True
    )
    await queue.bind(exchange)
    heard: dict[str, HeardMember] = {}
    first = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        try:
            beat = orjson.loads(message.body)
            member = str(beat["member"])
            held = tuple(sorted((str(t), int(p)) for t, p in beat.get("held") or []))
            leaving, url = bool(beat.get("leaving")), beat.get("url")
        except Exception:
            return  # not a heartbeat of ours
        if leaving:
            heard.pop(member, None)
            return
        heard[member] = HeardMember(member, None if url is None else str(url), held)
        first.set()

    await queue.consume(on_message, no_ack=True)
    deadline = time.monotonic() + window_s
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first.wait(), max(deadline - time.monotonic(), 0))
    with contextlib.suppress(Exception):
        await channel.close()
    return sorted(heard.values(), key=lambda m: m.member_id)


async def _consumers(connection: AbstractConnection, queues: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in queues:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            continue  # a missing queue has no consumer (the channel is closed by it)
        count = declared.declaration_result.consumer_count or 0
        if count:
            out[name] = int(count)
        with contextlib.suppress(Exception):
            await channel.close()
    return out


async def running_workers(app: App, settings: Settings) -> list[str]:
    """One line per member heard beating, and one naming the partition queues that have
    consumers (a worker with pinned partitions does not beat)."""
    queues = [queue_name(t.name, p) for t in app.sources.values() for p in range(t.partitions)]
    heard, consumers = await running(app, settings, queues)
    out = []
    for member in heard:
        held = " ".join(f"{t}[{p}]" for t, p in member.held) or "no partition yet"
        out.append(
            f"member {member.member_id} of app {app.id!r} beats on exchange "
            f"{app.members_topic} (views {member.url}), holding {held}"
        )
    if consumers:
        listed = ", ".join(f"{q} ({n})" for q, n in sorted(consumers.items()))
        out.append(f"partition queues with consumers: {listed}")
    return out
