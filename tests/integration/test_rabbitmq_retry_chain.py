"""The retry chain on real RabbitMQ, where it is RabbitMQ's own: copies routed by
partition and acked once republished, a worker stopped during the relay's wait (the
copy stays in its queue), delayed delivery through ``{topic}-delay``, the worker naming
missing retry and dead-letter queues, an unconfirmed copy. The chain's shared behaviour
(hops, back-offs, headers, dead letters) is the contract suite,
``tests/contract/test_chain_contract.py``.

Nothing is mocked. What crossed the broker is read by a *tap*: a queue of the test's
own, bound to the same direct exchanges with every partition's routing key, so it
receives a copy of every message routed there without taking anything from the
worker's queues.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest

from streamapp import App, Event, FromEventStore, MissingTopicError, Retry, Table, TableView
from streamapp.codecs import amqp as codec
from streamapp.topics import partition_for
from streamapp.transports.rabbitmq.relay import RabbitRelay
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import create_topology, plans
from streamapp.transports.rabbitmq.wire import from_message
from streamapp.worker import Worker
from tests.conftest import Services
from tests.support.tasks import source_progress
from tests.support.waits import finished, run_watched
from tests.support.waits import until as wait_until

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


async def until(
    check: Callable[[], Any], what: str, progress: Callable[[], Any] | None = None
) -> None:
    """Until ``check`` holds; fails once ``progress`` (the handler's calls; without it,
    nothing) stood still for 30 s."""
    await wait_until(check, what=what, progress=progress, stalled_s=30, poll_s=0.05)


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


async def test_copies_travel_the_partition_queues_and_are_acked_once_republished(
    amqp: str, tmp_path: Path
) -> None:
    """RabbitMQ's side of the chain (its shared behaviour is the contract suite,
    ``tests/contract/test_chain_contract.py``): the copy and the republished record take
    the routing key of the original's partition, the relay acks each copy once its
    republish is confirmed (the retry queues end empty), and the dead letter stays in
    its queue (nothing consumes it)."""
    ns = f"rcy{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)
    sums: Table[int] = Table("sums")
    calls: Counter[str] = Counter()

    @app.agent(
        topic,
        tables=[sums],
        history=FromEventStore(),
        on_failure=Retry(intervals=(0.1,), max_reconsume=3, backoff=(0.2,)),
    )
    async def summer(event: Event, view: TableView[int]) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        if event.type == "poison" or (event.id == "flaky" and calls[event.id] <= 2):
            raise RuntimeError(f"failure {calls[event.id]}")  # after the write: rolled back

    settings = app.settings()
    created = await create_topology(app, settings)
    assert {f"{ns}in", f"{ns}in-retry", f"{ns}in-dlq"} <= set(created)
    flaky = Event.create("add", stream_id="s", data={"n": 7}, id="flaky", version=1)
    poison = Event.create("poison", stream_id="s", data={"n": 1}, id="poison", version=2)
    p = partition_for(b"s", 2)
    async with tap(amqp, {topic.name: 2, f"{ns}in-retry": 2}) as seen:
        worker = Worker(app, settings)
        await worker.start()
        try:
            assert isinstance(worker.relay, RabbitRelay)
            await send(app, topic.name, [flaky, poison])

            async def done() -> bool:
                applied = calls["flaky"] == 3 and await table_value(worker, "sums", "s") == 7
                return applied and await depth(amqp, f"{ns}in-dlq.{p}") == 1

            what = f"flaky applied on its copy, poison dead-lettered ({calls})"
            await until(done, what, lambda: sum(calls.values()))
            await until(lambda: _relayed(worker, 2), "both copies republished")
        finally:
            await worker.stop()
    routes = [(m.exchange, m.routing_key, m.headers.get("cloudEvents_id")) for m in seen]
    copies = [r for r in routes if r[0] == f"{ns}in-retry"]
    assert sorted(copies) == [
        (f"{ns}in-retry", str(p), b"flaky"),
        (f"{ns}in-retry", str(p), b"poison"),
    ]
    assert {r[:2] for r in routes if r[0] == topic.name} == {(topic.name, str(p))}
    for q in range(2):  # every copy acked after its republish
        assert await depth(amqp, f"{ns}in-retry.{q}") == 0
    assert await depth(amqp, f"{ns}in-dlq.{p}") == 1  # kept: nothing consumes it
    assert await depth(amqp, f"{ns}in-dlq.{1 - p}") == 0


async def _relayed(worker: Worker, n: int) -> bool:
    assert isinstance(worker.relay, RabbitRelay)
    return worker.relay.relayed == n


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
    q = partition_for(b"s", 2)
    retry_queue = f"{ns}in-retry.{q}"

    async def held_by(worker: Worker) -> None:
        relay = worker.relay
        assert isinstance(relay, RabbitRelay)

        async def holding() -> bool:
            return relay.held == 1

        await until(holding, "held by the relay")
        assert await depth(amqp, retry_queue) == 0  # unacked, in the relay's hands
        text = worker.metrics.render().decode()
        assert 'streamapp_relay_held_copies{relay="rabbitmq"} 1.0' in text
        assert f'streamapp_relay_lag{{partition="{q}",topic="{ns}in-retry"}} 1.0' in text
        assert f'streamapp_relay_lag{{partition="{1 - q}",topic="{ns}in-retry"}} 0.0' in text

    worker = Worker(app, settings)
    await worker.start()
    try:
        await send(app, topic.name, [Event.create("x", stream_id="s", data={}, id="e")])
        await held_by(worker)
    finally:
        # the stop ends the 60 s wait: a stop held by it stands still for 30 s and fails
        await finished(
            worker.stop(),
            what="the worker stopped",
            progress=lambda: source_progress(worker.source),
            stalled_s=30,
        )
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

            await until(came_again, "delivered again after a failed copy", lambda: calls["e"])
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
    run = run_watched(
        streamapp_cmd("topics", "create", "-A", "tests.apps.retry_app:app"),
        env=env,
        cwd=ROOT,
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
