"""The retry chain on real RabbitMQ: a record that fails, then succeeds through
``{topic}-retry`` (the header contract read from the broker), a poison record
dead-lettered in ``{topic}-dlq`` without holding its partition, a worker stopped during
the relay's wait (the copy stays in its queue), delayed delivery through
``{topic}-delay``, and the worker naming missing retry and dead-letter queues.

Nothing is mocked. What crossed the broker is read by a *tap*: a queue of the test's
own, bound to the same direct exchanges with every partition's routing key, so it
receives a copy of every message routed there without taking anything from the
worker's queues.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest

from streamapp import App, Event, FromEventStore, MissingTopicError, Retry, Table, TableView
from streamapp.partitioner import partition_for
from streamapp.rabbitmq import codec
from streamapp.rabbitmq.relay import RabbitRelay
from streamapp.rabbitmq.sink import RabbitSink
from streamapp.rabbitmq.topology import create_topology, plans
from streamapp.rabbitmq.wire import from_message
from streamapp.worker import Worker
from tests.conftest import Services

from .harness import ROOT, app_env, streamapp_cmd

pytestmark = pytest.mark.integration


@pytest.fixture
def amqp(services: Services) -> str:
    return services.amqp


@dataclass(frozen=True)
class Tapped:
    """One message as the tap received it."""

    exchange: str
    routing_key: str
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    at_ms: float


@asynccontextmanager
async def tap(amqp: str, exchanges: Mapping[str, int]) -> AsyncIterator[list[Tapped]]:
    """Every message routed to ``exchanges`` (name: partitions) while open, in order."""
    seen: list[Tapped] = []
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        for exchange, partitions in exchanges.items():
            for p in range(partitions):
                await queue.bind(exchange, routing_key=str(p))

        async def received(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            key, value, headers = from_message(message.body, message.headers, message.content_type)
            seen.append(
                Tapped(
                    message.exchange or "",
                    message.routing_key or "",
                    key,
                    value,
                    dict(headers),
                    time.time() * 1000,
                )
            )
            await message.ack()

        await queue.consume(received)
        yield seen
    finally:
        await connection.close()


async def depth(amqp: str, queue: str) -> int:
    """Ready messages in ``queue`` (a passive declare)."""
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        assert count is not None
        return count
    finally:
        await connection.close()


async def until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"not {what} within {within_s:.0f}s"
        await asyncio.sleep(0.05)


def new_app(ns: str, tmp_path: Path, amqp: str, **settings: Any) -> App:
    return App(
        f"{ns}app",
        broker="rabbitmq",
        amqp_url=amqp,
        event_store=f"sqlite:///{tmp_path / 'events.db'}",
        data_dir=tmp_path / "data",
        web_port=0,
        poll_timeout_ms=100,
        amqp_heartbeat_ms=200,
        amqp_session_timeout_ms=1200,
        publish_timeout_s=10.0,
        rebalance_timeout_ms=4000,
        batch_budget_ms=1000,
        shutdown_timeout_s=20.0,
        **settings,
    )


async def send(app: App, topic: str, events: list[Event]) -> None:
    settings = app.settings()
    sink = RabbitSink(settings, {p.name: p.partitions for p in plans(app)})
    await sink.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await sink.publish(topic, value, key=key, headers=headers)
    finally:
        await sink.stop()


async def table_value(worker: Worker, table: str, key: str) -> Any:
    """The key's committed value from the worker's view (None: absent or not served)."""
    url = f"http://127.0.0.1:{worker.web_port}/tables/{table}/{key}"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return await r.json() if r.status == 200 else None


def metric(worker: Worker, name: str, agent: str) -> float | None:
    prefix = f'{name}{{agent="{agent}"}} '
    for line in worker.metrics.render().decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def business(headers: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in headers.items() if not k.startswith("x-")}


async def test_fails_five_times_then_succeeds_through_the_retry_queue(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcy{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)
    sums: Table[int] = Table("sums")
    calls: Counter[str] = Counter()

    @app.agent(
        topic,
        tables=[sums],
        history=FromEventStore(),
        on_failure=Retry(intervals=(0.1, 0.2), backoff=(0.4,)),
    )
    async def summer(event: Event, view: TableView[int]) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        if event.id == "flaky" and calls[event.id] <= 5:
            raise RuntimeError(f"failure {calls[event.id]}")  # after the write: rolled back

    settings = app.settings()
    created = await create_topology(app, settings)
    assert {f"{ns}in", f"{ns}in-retry", f"{ns}in-dlq"} <= set(created)
    flaky = Event.create("add", stream_id="s", data={"n": 7}, id="flaky", version=1)
    p = partition_for(b"s", 2)
    async with tap(amqp, {topic.name: 2, f"{ns}in-retry": 2}) as seen:
        worker = Worker(app, settings)
        await worker.start()
        try:
            assert isinstance(worker.relay, RabbitRelay)
            sent_ms = time.time() * 1000
            await send(app, topic.name, [flaky])

            async def applied() -> bool:
                return calls["flaky"] == 6 and await table_value(worker, "sums", "s") == 7

            await until(applied, f"applied once after 5 failures (calls {calls})")
            await asyncio.sleep(1.0)  # nothing more comes
            assert calls["flaky"] == 6
            assert await table_value(worker, "sums", "s") == 7  # as if it ran once
            assert metric(worker, "streamapp_retried_total", "summer") == 1
            assert metric(worker, "streamapp_failed_attempts_total", "summer") == 5
            assert metric(worker, "streamapp_dead_lettered_total", "summer") is None
            assert worker.relay.relayed == 1
        finally:
            await worker.stop()
    original, copy, back = seen
    assert (original.exchange, original.routing_key) == (topic.name, str(p))
    assert (copy.exchange, copy.routing_key) == (f"{ns}in-retry", str(p))  # same partition
    assert copy.headers["x-reconsume"] == b"3"  # the first delivery and two inline retries
    assert copy.headers["x-retry-hop"] == b"1"
    assert copy.headers["x-origin-topic"] == topic.name.encode()
    assert copy.headers["x-retry-agent"] == b"summer"
    due = int(copy.headers["x-deliver-at"])
    assert sent_ms + 400 <= due <= copy.at_ms + 400 + 100
    assert business(copy.headers) == business(original.headers)  # CloudEvent kept
    assert copy.key == b"s"
    assert copy.value == original.value
    assert (back.exchange, back.routing_key) == (topic.name, str(p))
    assert back.at_ms >= due - 50  # not before it was due (a little clock slack)
    assert back.headers["x-reconsume"] == b"3"
    assert back.headers["x-retry-hop"] == b"1"
    assert back.headers["x-retry-agent"] == b"summer"
    assert "x-deliver-at" not in back.headers
    assert "x-origin-topic" not in back.headers
    assert business(back.headers) == business(original.headers)
    assert back.key == b"s"
    assert back.value == original.value
    for q in range(2):  # every copy acked after its republish; nothing dead-lettered
        assert await depth(amqp, f"{ns}in-retry.{q}") == 0
        assert await depth(amqp, f"{ns}in-dlq.{q}") == 0


async def test_a_poison_record_is_dead_lettered_and_does_not_hold_its_partition(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcd{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)
    intervals = (0.1, 0.2)
    seen: dict[str, float] = {}
    attempts: Counter[str] = Counter()

    @app.agent(topic, on_failure=Retry(intervals=intervals, max_reconsume=7, backoff=(0.2, 0.4)))
    async def picky(event: Event) -> None:
        seen.setdefault(event.id, time.monotonic())
        if event.type == "poison":
            attempts[event.id] += 1
            raise ValueError("never")

    settings = app.settings()
    await create_topology(app, settings)
    p = partition_for(b"s", 2)
    dlq = f"{ns}in-dlq.{p}"
    worker = Worker(app, settings)
    await worker.start()
    try:
        events = [Event.create("poison", stream_id="s", data={}, id="poison")]
        events += [Event.create("ok", stream_id="s", data={}, id=f"ok{i}") for i in range(3)]
        await send(app, topic.name, events)

        async def dead_lettered() -> bool:
            return await depth(amqp, dlq) == 1

        await until(dead_lettered, "dead-lettered")
        assert attempts["poison"] == 8  # max_reconsume + 1
        for i in range(3):  # later records of its partition waited the inline budget only
            assert seen[f"ok{i}"] - seen["poison"] < sum(intervals) + 1.5
        assert metric(worker, "streamapp_retried_total", "picky") == 2
        assert metric(worker, "streamapp_dead_lettered_total", "picky") == 1
        assert metric(worker, "streamapp_failed_attempts_total", "picky") == 8
    finally:
        await worker.stop()
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(dlq, passive=True)
        message = await queue.get(timeout=5)
        assert message is not None
        key, _, listed = from_message(message.body, message.headers, message.content_type)
        headers = dict(listed)
        await message.ack()
    finally:
        await connection.close()
    assert key == b"s"
    assert headers["cloudEvents_id"] == b"poison"
    assert headers["x-reconsume"] == b"8"
    assert headers["x-retry-hop"] == b"2"  # two round trips through the retry queue
    assert headers["x-origin-topic"] == topic.name.encode()
    assert headers["x-retry-agent"] == b"picky"
    assert headers["x-dlq-reason"].startswith(b"failed 8 times: ")
    assert b"never" in headers["x-dlq-reason"]
    assert headers["x-origin"].startswith(f"{topic.name}/{p}/".encode())
    assert "x-deliver-at" not in headers
    for q in range(2):
        assert await depth(amqp, f"{ns}in-retry.{q}") == 0


async def test_a_worker_stopped_during_the_relay_wait_leaves_the_copy_in_its_queue(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcs{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)

    @app.agent(topic, on_failure=Retry(intervals=(0.05,), backoff=(60,)))
    async def failing(event: Event) -> None:
        raise RuntimeError("down")

    settings = app.settings()
    await create_topology(app, settings)
    retry_queue = f"{ns}in-retry.{partition_for(b's', 2)}"

    async def held_by(worker: Worker) -> None:
        relay = worker.relay
        assert isinstance(relay, RabbitRelay)

        async def holding() -> bool:
            return relay.held == 1

        await until(holding, "held by the relay")
        assert await depth(amqp, retry_queue) == 0  # unacked, in the relay's hands

    worker = Worker(app, settings)
    await worker.start()
    try:
        await send(app, topic.name, [Event.create("x", stream_id="s", data={}, id="e")])
        await held_by(worker)
    finally:
        started = time.monotonic()
        await worker.stop()
    assert time.monotonic() - started < 10  # the wait ends at once
    assert await depth(amqp, retry_queue) == 1  # back in its queue, not lost
    again = Worker(app, settings)  # another relay takes it up, still waiting for it
    await again.start()
    try:
        await held_by(again)
        assert again.relay is not None
        assert again.relay.relayed == 0
    finally:
        await again.stop()
    assert await depth(amqp, retry_queue) == 1


async def test_delayed_sends_under_relay_go_through_the_delay_queue(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcl{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp, delayed_policy="relay")
    topic = app.topic(f"{ns}in", partitions=2)
    out = app.topic(f"{ns}out", partitions=2)

    @app.agent(topic, sinks=[out])
    async def later(event: Event, *, send: Any) -> None:
        send(out, Event.create("later", stream_id="o", data={}, id="d-" + event.id), delay_s=0.5)

    settings = app.settings()
    created = await create_topology(app, settings)
    assert f"{ns}out-delay" in created
    async with tap(amqp, {out.name: 2, f"{ns}out-delay": 2}) as seen:
        worker = Worker(app, settings)
        await worker.start()
        try:
            await send(app, topic.name, [Event.create("x", stream_id="s", data={}, id="e")])

            async def arrived() -> bool:
                return len(seen) == 2

            await until(arrived, "relayed")
        finally:
            await worker.stop()
    held, delivered = seen
    p = str(partition_for(b"o", 2))
    assert (held.exchange, held.routing_key) == (f"{ns}out-delay", p)
    assert held.headers["x-origin-topic"] == out.name.encode()
    due = int(held.headers["x-deliver-at"])
    assert (delivered.exchange, delivered.routing_key) == (out.name, p)
    assert delivered.at_ms >= due - 50
    assert delivered.headers["cloudEvents_id"] == b"d-e"
    assert "x-deliver-at" not in delivered.headers
    assert "x-origin-topic" not in delivered.headers
    assert business(delivered.headers) == business(held.headers)


async def test_a_worker_names_missing_retry_and_dead_letter_queues(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcm{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)

    @app.agent(app.topic(f"{ns}in", partitions=2), on_failure=Retry())
    async def any_agent(event: Event) -> None:
        pass

    settings = app.settings()
    await create_topology(app, settings)
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        await channel.queue_delete(f"{ns}in-retry.1")
        await channel.exchange_delete(f"{ns}in-dlq")
    finally:
        await connection.close()
    worker = Worker(app, settings, "mod:app")
    with pytest.raises(MissingTopicError) as err:
        await worker.start()
    message = str(err.value)
    assert f"queue {ns}in-retry.1" in message
    assert f"exchange {ns}in-dlq" in message
    assert "STREAMAPP_BROKER=rabbitmq streamapp topics create -A mod:app" in message
    assert await create_topology(app, settings) == [f"{ns}in-retry", f"{ns}in-dlq"]


async def test_a_retry_copy_that_is_not_confirmed_leaves_the_original_unacked(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rcu{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)
    calls: Counter[str] = Counter()

    @app.agent(topic, on_failure=Retry(intervals=(0.05, 0.05), backoff=(60,)))
    async def failing(event: Event) -> None:
        calls[event.id] += 1
        raise RuntimeError("down")

    settings = app.settings()
    await create_topology(app, settings)
    p = partition_for(b"s", 2)
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        retry_queue = await channel.declare_queue(f"{ns}in-retry.{p}", passive=True)
        await retry_queue.unbind(f"{ns}in-retry", routing_key=str(p))  # copies unroutable
        worker = Worker(app, settings)
        await worker.start()
        try:
            await send(app, topic.name, [Event.create("x", stream_id="s", data={}, id="e")])

            async def came_again() -> bool:
                return calls["e"] >= 6  # two rounds of three attempts: not acked

            await until(came_again, "delivered again after a failed copy")
            assert metric(worker, "streamapp_retried_total", "failing") is None
            await retry_queue.bind(f"{ns}in-retry", routing_key=str(p))
            relay = worker.relay
            assert isinstance(relay, RabbitRelay)

            async def copied() -> bool:
                return relay.held == 1

            await until(copied, "copied once the retry queue is bound again")
            assert metric(worker, "streamapp_retried_total", "failing") == 1
        finally:
            await worker.stop()
    finally:
        await connection.close()
    assert await depth(amqp, f"{ns}in.{p}") == 0  # acked once its copy was confirmed
    assert await depth(amqp, f"{ns}in-retry.{p}") == 1  # the copy, back from the relay


def topics_create(ns: str, amqp: str) -> str:
    """``streamapp topics create`` of the retry app on RabbitMQ (policy relay); its output."""
    env = app_env(
        "127.0.0.1:1",
        ns,
        STREAMAPP_BROKER="rabbitmq",
        STREAMAPP_AMQP_URL=amqp,
        STREAMAPP_DELAYED_POLICY="relay",
    )
    run = subprocess.run(
        streamapp_cmd("topics", "create", "-A", "tests.integration.retry_app:app"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


async def test_topics_create_declares_the_chain_queues(amqp: str) -> None:
    ns = f"rcc{uuid.uuid4().hex[:6]}-"
    out = topics_create(ns, amqp)
    assert f"{ns}rt-in-retry\t2 partitions\tretry\tcreated" in out
    assert f"{ns}rt-in-dlq\t2 partitions\tdead-letter\tcreated" in out
    for p in range(2):
        assert await depth(amqp, f"{ns}rt-in-retry.{p}") == 0
        assert await depth(amqp, f"{ns}rt-in-dlq.{p}") == 0
