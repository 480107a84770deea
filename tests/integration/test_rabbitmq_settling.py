"""Each row of DESIGN.md "Outcomes and settling", checked on RabbitMQ itself.

A RabbitMQ-fed agent runs in-process (:class:`~tests.contract.rabbit_harness.RabbitHarness`);
the assertions read the broker, never the worker's own counters alone: queue depth and
consumer count by passive declare, the ``redelivered`` flag and the parking copies with a
raw aio-pika consumer. With no management plugin, "nothing unacked" is read as: once the
worker's channels are closed, the queue is still empty (the broker requeues unacked
messages when their channel closes).

How each row is realised on RabbitMQ:

- DELIVERED, FILTERED: acked (one ``ack(multiple=True)`` per batch, after the commit).
- DEFERRED (catch-up running): the partition queue is not consumed until the handover:
  the messages wait at the broker, never delivered, so never requeued.
- UNAVAILABLE (no agent takes it now): a partition no worker owns is not consumed; a
  partition that closes (stop, revocation) with deliveries in hand closes its channel:
  they go back, flagged redelivered.
- Redeliver: held, then requeued (``nack`` with requeue) at most once per poll interval.
- Park: the copy is published and confirmed on the parking queue, then the original acked;
  a park that fails leaves the original unacked (it comes back).
- REFUSED (a partition that cannot run: tables without history or local state): the
  source fails, the worker stops, what it held goes back, flagged.
- A consumer cancelled by the broker (its queue deleted), or a queue missing after a
  reconnect, fails the source loudly; the other partitions are not held up meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pytest

from streamapp import ConfigError, Event, Park, Redeliver, Table, TableView
from streamapp.codecs import amqp as codec
from streamapp.errors import SourceError
from streamapp.topics import partition_for
from streamapp.transports.rabbitmq.port import RabbitPartitionPort
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.source import RabbitSource
from streamapp.transports.rabbitmq.topology import queue_name
from streamapp.worker import Worker
from tests.conftest import Services
from tests.contract.rabbit_harness import RabbitHarness
from tests.contract.test_agent_contract import AGENT, ev, key_on, log_app, logged
from tests.support.tasks import source_progress
from tests.support.waits import finished, until

from .harness import Proxy, append_to_store

pytestmark = pytest.mark.integration

CLOSE_FAST = {"rebalance_timeout_ms": 2000, "batch_budget_ms": 1000}
"""A closing partition waits 1 s for a batch in hand (a blocked one is then cancelled)."""


@pytest.fixture
async def h(services: Services, tmp_path: Path) -> AsyncIterator[RabbitHarness]:
    harness = RabbitHarness(services.amqp, tmp_path)
    try:
        yield harness
    finally:
        await harness.stop()


# --- the broker, read directly -----------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One message as a raw consumer received it."""

    id: str
    redelivered: bool
    headers: dict[str, Any]


async def on_broker(amqp: str, queue: str) -> tuple[int, int]:
    """``(ready messages, consumers)`` of ``queue``, by passive declare."""
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        result = declared.declaration_result
        assert result.message_count is not None
        assert result.consumer_count is not None
        return result.message_count, result.consumer_count
    finally:
        await connection.close()


async def read_raw(amqp: str, queue: str, n: int, *, ack: bool) -> list[Seen]:
    """The first ``n`` messages of ``queue``, by a raw consumer with manual acks; with
    ``ack=False`` they go back to the queue when its connection closes."""
    seen: list[Seen] = []
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)

        async def read() -> bool:
            message = await declared.get(no_ack=False, fail=False)
            if message is not None:
                headers = dict(message.headers or {})
                seen.append(Seen(str(headers.get("cloudEvents_id")), message.redelivered, headers))
                if ack:
                    await message.ack()
            return len(seen) == n

        await until(  # progress: messages read
            read,
            what=f"{n} messages read from {queue}",
            progress=lambda: len(seen),
            stalled_s=30,
            detail=lambda: [s.id for s in seen],
        )
    finally:
        await connection.close()
    return seen


def source_of(h: RabbitHarness) -> RabbitSource:
    assert h.worker is not None
    source = h.worker.source
    assert isinstance(source, RabbitSource)
    return source


def port_of(h: RabbitHarness, p: int) -> RabbitPartitionPort:
    return source_of(h).ports[(h.topic, p)]


def acked(h: RabbitHarness, p: int) -> int:
    """Deliveries of partition ``p`` acked by this worker (0 before it took ``p``)."""
    port = source_of(h).ports.get((h.topic, p))
    return 0 if port is None else port.acked


def outcomes(h: RabbitHarness, p: int) -> dict[str, int]:
    status = source_of(h).assignment.tasks[(h.topic, p)].status()
    counts = status["outcomes"]
    assert isinstance(counts, dict)
    return counts


# --- DELIVERED, FILTERED ------------------------------------------------------------------


async def test_delivered_and_filtered_are_acked_nothing_left_unacked(
    h: RabbitHarness, services: Services
) -> None:
    await h.start(log_app(h, partitions=2, filter=lambda e: e.type != "skip"))
    keys = [key_on(0, 2), key_on(1, 2)]
    for i in range(40):
        await h.send(ev(keys[i % 2], f"e{i}", type="skip" if i % 4 >= 2 else "add"))
    assert await h.settle()
    queues = [queue_name(h.topic, p) for p in range(2)]
    assert [await on_broker(services.amqp, q) for q in queues] == [(0, 1), (0, 1)]
    for p in range(2):
        assert outcomes(h, p) == {"delivered": 10, "filtered": 10}
    assert await h.table("log", keys[0]) == logged(*(f"e{i}" for i in range(0, 40, 4)))
    await h.stop()  # closing the channels would requeue anything left unacked
    assert [await on_broker(services.amqp, q) for q in queues] == [(0, 0), (0, 0)]


async def test_what_arrives_while_a_batch_runs_is_the_next_batch_acked_in_one(
    h: RabbitHarness, services: Services
) -> None:
    """Batches grow with the load, as on Kafka: deliveries that arrive while a batch
    runs and commits wait in the task's ahead queue (the port is not paused for it) and
    run next, all in one batch, settled with one ``ack(multiple=True)``."""
    key = key_on(0, 1)
    gate = asyncio.Event()

    async def hold(event: Event, view: TableView[Any]) -> None:
        if event.id == "e0":
            await gate.wait()  # the first batch stays in hand meanwhile

    await h.start(log_app(h, partitions=1, fail=hold))
    await h.send(ev(key, "e0"))
    await h.until(lambda: h.calls["e0"] == 1, "the first batch in hand")
    for i in range(1, 10):
        await h.send(ev(key, f"e{i}"))
    task = source_of(h).assignment.tasks[(h.topic, 0)]
    await h.until(lambda: len(task.ahead.waiting) == 9, "the rest queued behind it")
    assert task.busy
    gate.set()
    assert await h.settle()
    assert await h.table("log", key) == logged(*(f"e{i}" for i in range(10)))
    assert port_of(h, 0).acked == 10
    assert h.worker is not None
    batches = h.worker.metrics.registry.get_sample_value(
        "streamapp_batch_size_count", {"agent": AGENT}
    )
    assert batches == 2  # e0, then e1-e9 together
    queue = queue_name(h.topic, 0)
    assert await on_broker(services.amqp, queue) == (0, 1)


# --- DEFERRED -----------------------------------------------------------------------------


async def test_deferred_during_catch_up_waits_on_the_broker_then_is_taken_once(
    h: RabbitHarness, services: Services, tmp_path: Path
) -> None:
    key = key_on(0, 1)
    replaying = asyncio.Event()

    async def hold(event: Event, view: TableView[Any]) -> None:
        if event.id == "stored":
            await replaying.wait()  # the catch-up stays in progress meanwhile

    await append_to_store(f"sqlite:///{tmp_path / 'events.db'}", [ev(key, "stored", version=1)])
    await h.start(log_app(h, partitions=1, fail=hold))
    await h.until(lambda: h.calls["stored"] == 1, "replaying")
    for v in range(2, 12):
        await h.send(ev(key, f"live{v}", version=v))
    queue = queue_name(h.topic, 0)
    await asyncio.sleep(1.0)  # a consumer, if there were one, would have taken them
    assert source_of(h).assignment.tasks[(h.topic, 0)].phase.value == "catching_up"
    assert await on_broker(services.amqp, queue) == (10, 0)  # held at the broker
    replaying.set()
    assert await h.settle()
    assert await on_broker(services.amqp, queue) == (0, 1)
    assert await h.table("log", key) == logged("stored", *(f"live{v}" for v in range(2, 12)))
    assert port_of(h, 0).redelivered == 0  # never delivered before the handover
    await h.stop()
    assert await on_broker(services.amqp, queue) == (0, 0)


# --- UNAVAILABLE --------------------------------------------------------------------------


async def test_unavailable_is_left_on_the_broker_or_goes_back_flagged_when_the_agent_closes(
    h: RabbitHarness, services: Services
) -> None:
    gate = asyncio.Event()

    async def hold(event: Event, view: TableView[Any]) -> None:
        if event.id.startswith("held"):
            await gate.wait()  # never set: the batch is in hand when the worker stops

    await h.start(log_app(h, partitions=2, fail=hold, amqp_partitions="0", **CLOSE_FAST))
    mine, other = key_on(0, 2), key_on(1, 2)
    for i in range(5):
        await h.send(ev(other, f"unowned{i}"))
    for i in range(5):
        await h.send(ev(mine, f"held{i}"))
    q_mine, q_other = queue_name(h.topic, 0), queue_name(h.topic, 1)
    await h.until(lambda: h.calls["held0"] == 1, "handling held0")
    await h.until(lambda: _on_broker_is(services.amqp, q_mine, (0, 1)), "all delivered")
    assert await on_broker(services.amqp, q_other) == (5, 0)  # nobody takes partition 1
    assert port_of(h, 0).acked == 0

    await h.stop()  # the agent closes with held0..4 in hand: nothing acked
    assert await on_broker(services.amqp, q_mine) == (5, 0)
    back = await read_raw(services.amqp, q_mine, 5, ack=True)
    assert [s.id for s in back] == [f"held{i}" for i in range(5)]
    assert all(s.redelivered for s in back)
    untouched = await read_raw(services.amqp, q_other, 5, ack=True)
    assert [s.id for s in untouched] == [f"unowned{i}" for i in range(5)]
    assert not any(s.redelivered for s in untouched)  # never delivered


async def _on_broker_is(amqp: str, queue: str, want: tuple[int, int]) -> bool:
    return await on_broker(amqp, queue) == want


# --- Redeliver ----------------------------------------------------------------------------


async def test_redeliver_holds_then_requeues_at_poll_pace_flagged(
    h: RabbitHarness, services: Services
) -> None:
    key = key_on(0, 1)

    async def poison(event: Event, view: TableView[Any]) -> None:
        if event.id == "poison":
            raise ConnectionError("still down")

    # pause_s=0: the only pace left is the port's, one requeue per poll interval (0.5 s)
    policy = Redeliver(pause_s=0.0)
    await h.start(log_app(h, partitions=1, on_failure=policy, fail=poison, poll_timeout_ms=500))
    for name in ("a", "poison", "b"):
        await h.send(ev(key, name))
    await h.until(lambda: h.calls["poison"] >= 2, "poison retried")
    before, started = h.calls["poison"], time.monotonic()
    await asyncio.sleep(3.0)
    attempts, window = h.calls["poison"] - before, time.monotonic() - started
    assert 1 <= attempts <= window / 0.5 + 3, attempts  # paced, not a hot loop
    assert port_of(h, 0).acked == 1  # a; poison and b are held or requeued, never acked
    assert h.calls["b"] == 0  # order holds: nothing passes the failing message

    await h.stop()
    queue = queue_name(h.topic, 0)
    assert await on_broker(services.amqp, queue) == (2, 0)
    back = await read_raw(services.amqp, queue, 2, ack=True)
    assert [(s.id, s.redelivered) for s in back] == [("poison", True), ("b", True)]


# --- Park ---------------------------------------------------------------------------------


async def test_park_publishes_the_copy_with_its_reason_before_the_original_is_acked(
    h: RabbitHarness, services: Services
) -> None:
    key = key_on(0, 1)
    parking = h.name("in.parked")

    async def boom(event: Event, view: TableView[Any]) -> None:
        if event.id == "poison":
            raise ValueError("cannot apply poison")

    app = log_app(h, partitions=1, on_failure=Park(parking), fail=boom)
    await h.start(app)
    await _delete_queue(services.amqp, queue_name(parking, 0))  # the park cannot be confirmed
    for name in ("a", "poison", "b"):
        await h.send(ev(key, name))
    await h.until(lambda: h.calls["poison"] >= 2, "the park retried")
    assert port_of(h, 0).acked == 1  # only a
    await h.stop()
    queue = queue_name(h.topic, 0)
    assert await on_broker(services.amqp, queue) == (2, 0)  # the original was not acked
    back = await read_raw(services.amqp, queue, 2, ack=False)  # they go back again
    assert [(s.id, s.redelivered) for s in back] == [("poison", True), ("b", True)]

    await h.start(app)  # re-creates the parking queue (topics create)
    await h.until(lambda: acked(h, 0) == 2, "poison parked and b applied")
    assert await on_broker(services.amqp, queue) == (0, 1)
    assert await on_broker(services.amqp, queue_name(parking, 0)) == (1, 0)
    (copy,) = await read_raw(services.amqp, queue_name(parking, 0), 1, ack=True)
    assert copy.id == "poison"
    assert copy.headers["streamapp-park-reason"] == "ValueError: cannot apply poison"
    assert copy.headers["streamapp-agent"] == AGENT
    assert str(copy.headers["streamapp-source"]).startswith(f"{h.topic}/0/")
    assert await h.table("log", key) == logged("a", "b")  # poison's write rolled back
    await h.stop()
    assert await on_broker(services.amqp, queue) == (0, 0)


async def _delete_queue(amqp: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue)
    finally:
        await connection.close()


# --- REFUSED ------------------------------------------------------------------------------


async def test_refused_stops_the_source_and_what_it_held_goes_back_flagged(
    h: RabbitHarness, services: Services, tmp_path: Path
) -> None:
    mine, refused = key_on(0, 2), key_on(1, 2)
    # With history (the harness adds it), partition 0 only: it gets local state.
    await h.start(log_app(h, partitions=2, amqp_partitions="0"))
    await h.send(ev(mine, "seed"))
    assert await h.settle()
    await h.stop()

    # The same agent without history: partition 0 has local state, partition 1 has none
    # and is refused (RabbitMQ keeps no changelog to restore it from).
    gate = asyncio.Event()
    app2 = h.new_app(**CLOSE_FAST)
    log: Table[dict[str, Any]] = Table("log")

    @app2.agent(app2.topic(h.topic, partitions=2), tables=[log], name=AGENT)
    async def logger(event: Event, view: TableView[dict[str, Any]]) -> None:
        h.calls[event.id] += 1
        await gate.wait()  # never set: held in hand

    settings = app2.settings()
    sink = RabbitSink(settings, {h.topic: 2})
    await sink.start()
    try:
        for i in range(4):
            for key, name in ((mine, "held"), (refused, "never")):
                k, body, headers = codec.encode(ev(key, f"{name}{i}"))
                await sink.publish(h.topic, body, key=k, headers=headers)
    finally:
        await sink.stop()
    worker = Worker(app2, settings)
    await worker.start()
    try:
        assert worker.source is not None
        with pytest.raises(ConfigError, match=r"declare history=FromEventStore\(\)"):
            await finished(
                worker.source.wait(),
                what="the source refused",
                progress=lambda: (source_progress(worker.source), sum(h.calls.values())),
            )
        await until(  # a worker of its own: the harness runs none to watch
            lambda: h.calls["held0"] == 1,
            what="partition 0 holding",
            progress=lambda: sum(h.calls.values()),
            stalled_s=30,
        )
    finally:
        await worker.stop()  # what Worker.run does when its source fails

    q_mine, q_refused = queue_name(h.topic, 0), queue_name(h.topic, 1)
    assert await on_broker(services.amqp, q_mine) == (4, 0)  # depth restored
    back = await read_raw(services.amqp, q_mine, 4, ack=True)
    assert [(s.id, s.redelivered) for s in back] == [(f"held{i}", True) for i in range(4)]
    never = await read_raw(services.amqp, q_refused, 4, ack=True)
    assert [(s.id, s.redelivered) for s in never] == [(f"never{i}", False) for i in range(4)]
    assert h.calls["never0"] == 0


# --- basic.cancel -------------------------------------------------------------------------


async def test_queue_deleted_under_a_running_source_fails_it_naming_the_queue(
    h: RabbitHarness, services: Services
) -> None:
    await h.start(log_app(h, partitions=2))
    for p in range(2):
        await h.send(ev(key_on(p, 2), f"e{p}"))
    assert await h.settle()
    source = source_of(h)
    gone = queue_name(h.topic, 1)

    await _delete_queue(services.amqp, gone)  # the broker cancels the consumer
    with pytest.raises(SourceError) as failed:
        await finished(source.wait(), what="the source failed", progress=h.progress)
    message = str(failed.value)
    assert f"queue {gone!r}" in message
    assert "consumer cancelled by RabbitMQ" in message
    assert "STREAMAPP_BROKER=rabbitmq streamapp topics create -A MODULE:app" in message
    assert not failed.value.retriable
    port = source.ports[(h.topic, 1)]
    assert port.cancelled is failed.value
    await h.until(lambda: port._channel is None, "the channel closed")

    await h.send(ev(key_on(0, 2), "after"))  # the other partition was not touched
    await h.until(lambda: h.calls["after"] == 1, "partition 0 going on")
    assert partition_for(key_on(0, 2).encode(), 2) == 0


async def test_queue_deleted_while_disconnected_fails_the_source_others_go_on(
    services: Services, tmp_path: Path
) -> None:
    parts = urlsplit(services.amqp)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    port = await proxy.start()
    h = RabbitHarness(f"amqp://guest:guest@127.0.0.1:{port}/", tmp_path)
    try:
        await h.start(log_app(h, partitions=2))
        for p in range(2):
            await h.send(ev(key_on(p, 2), f"e{p}"))
        assert await h.settle()
        gone = queue_name(h.topic, 1)
        proxy.cut()
        await _delete_queue(services.amqp, gone)  # no basic.cancel reaches the worker
        with pytest.raises(SourceError) as failed:
            await finished(source_of(h).wait(), what="the source failed", progress=h.progress)
        assert f"queue {gone!r} no longer exists after a reconnect" in str(failed.value)
        assert "streamapp topics create" in str(failed.value)
        # the connection came back for partition 0 (one missing queue does not hold it)
        await h.send(ev(key_on(0, 2), "after"))
        await h.until(lambda: h.calls["after"] == 1, "partition 0 going on", stalled_s=60)
        assert await on_broker(services.amqp, queue_name(h.topic, 0)) == (0, 1)
    finally:
        await h.stop()
        await proxy.stop()
