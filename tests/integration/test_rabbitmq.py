"""RabbitMQ transport on a real broker: topology, confirmed publishing, the orders app.

Nothing is mocked: the broker is the session's RabbitMQ (fixture ``services``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from streamapp import App, Event, FromEventStore, PublishError
from streamapp.codecs import amqp as codec
from streamapp.records import Message
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import create_topology
from tests.conftest import Services
from tests.support.tasks import source_progress
from tests.support.waits import finished, frozen, run_watched, until

from .harness import (
    ROOT,
    Proxy,
    StreamappProc,
    WorkerProc,
    app_env,
    append_to_store,
    order_events,
    partitions_of,
    streamapp_cmd,
    wait_exact,
    wait_ready,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def amqp(services: Services) -> str:
    return services.amqp


@pytest.fixture
async def channel(amqp: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(amqp)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


async def depth(amqp: str, queue: str) -> int:
    """Ready messages in ``queue`` (a passive declare, on its own connection)."""
    connection = await aio_pika.connect(amqp)
    try:
        ch = await connection.channel()
        declared = await ch.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        assert count is not None
        return count
    finally:
        await connection.close()


async def exists(amqp: str, queue: str) -> bool:
    try:
        await depth(amqp, queue)
        return True
    except ChannelNotFoundEntity:
        return False


def tiny_app(ns: str, amqp: str, partitions: int = 4) -> App:
    app = App(f"{ns}tiny", broker="rabbitmq", amqp_url=amqp, publish_timeout_s=5.0)
    topic = app.topic(f"{ns}in", partitions=partitions)

    @app.agent(topic, history=FromEventStore())
    async def tiny(event: Event) -> None:
        pass

    return app


def rabbit_env(amqp: str, **extra: str) -> dict[str, str]:
    return {"STREAMAPP_BROKER": "rabbitmq", "STREAMAPP_AMQP_URL": amqp, **extra}


def topics_create(ns: str, env: dict[str, str]) -> str:
    """``streamapp topics create`` of the orders app on RabbitMQ; its output."""
    run = run_watched(
        streamapp_cmd("topics", "create", "-A", "agents.orders:app"),
        env=app_env("127.0.0.1:1", ns, **env),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


# --- topology ---------------------------------------------------------------------------


async def test_topics_create_makes_the_topology_and_a_worker_names_what_is_missing(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rt{uuid.uuid4().hex[:6]}-"
    out = topics_create(ns, rabbit_env(amqp))
    assert f"{ns}orders\t8 partitions\tsource\tcreated" in out
    assert f"{ns}orders.parked\t8 partitions\tparking\tcreated" in out
    assert "changelog" not in out  # no changelogs on RabbitMQ
    assert f"{ns}orders-members\tfanout exchange\tgroup membership\tcreated" in out
    for p in range(8):
        assert await exists(amqp, f"{ns}orders.{p}")
        assert await exists(amqp, f"{ns}orders.parked.{p}")
    assert not await exists(amqp, f"{ns}orders.8")

    connection = await aio_pika.connect(amqp)
    try:
        ch = await connection.channel()
        await ch.queue_delete(f"{ns}orders.3")
    finally:
        await connection.close()
    worker = WorkerProc(
        "127.0.0.1:1", ns, tmp_path / "data", tmp_path / "w.log", extra_env=rabbit_env(amqp)
    ).start()
    code = worker.wait_exit()
    out = worker.log_text()
    assert code != 0
    assert f"queue {ns}orders.3" in out
    assert "STREAMAPP_BROKER=rabbitmq streamapp topics create -A agents.orders:app" in out
    assert "Traceback" not in out
    assert not await exists(amqp, f"{ns}orders.3")  # never auto-created


# --- the sink ----------------------------------------------------------------------------


async def test_unroutable_publish_fails_routed_one_is_confirmed_and_persistent(
    amqp: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    ns = f"rs{uuid.uuid4().hex[:6]}-"
    app = tiny_app(ns, amqp)
    settings = app.settings()
    assert await create_topology(app, settings) == [f"{ns}in", f"{ns}tiny-members"]
    sink = RabbitSink(settings, {f"{ns}in": 4, f"{ns}nowhere": 4})
    await sink.start()
    try:
        with pytest.raises(PublishError, match=rf"exchange '{ns}in' routing key '9'.*unroutable"):
            await sink.publish(f"{ns}in", b"x", key=b"k", partition=9)
        with pytest.raises(PublishError, match=rf"exchange '{ns}nowhere'"):
            await sink.publish(f"{ns}nowhere", b"x", key=b"k")
        event = Event.create("t", stream_id="order-1", data={"a": 1}, version=1, id="e1")
        key, body, headers = codec.encode(event)
        await sink.publish(f"{ns}in", body, key=key, headers=headers)
    finally:
        await sink.stop()
    from streamapp.topics import partition_for

    p = partition_for(b"order-1", 4)
    queue = await channel.declare_queue(f"{ns}in.{p}", passive=True)
    message = await queue.get(timeout=5)
    assert message is not None
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.headers["cloudEvents_id"] == "e1"
    await message.ack()


async def test_publish_many_5000_arrive_complete_in_order_per_key(
    amqp: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    ns = f"rm{uuid.uuid4().hex[:6]}-"
    app = tiny_app(ns, amqp, partitions=3)
    settings = app.settings()
    await create_topology(app, settings)
    sink = RabbitSink(settings, {f"{ns}in": 3})
    await sink.start()
    n = 5000
    messages = [
        Message(f"{ns}in", str(i).encode(), f"k{i % 17}".encode(), [("seq", str(i).encode())])
        for i in range(n)
    ]
    try:
        started = time.monotonic()
        receipts = await sink.publish_many(messages)
        took = time.monotonic() - started
    finally:
        await sink.stop()
    assert len(receipts) == n
    print(f"publish_many: {n} confirmed in {took:.2f}s ({n / took:,.0f} msg/s)")
    counts = [await depth(amqp, f"{ns}in.{p}") for p in range(3)]
    assert sum(counts) == n
    last: dict[bytes, int] = {}
    for p in range(3):
        queue = await channel.declare_queue(f"{ns}in.{p}", passive=True)
        async with queue.iterator() as it:
            got = 0
            async for message in it:
                key = message.headers["streamapp-key"]
                seq = int(message.body)
                assert last.get(key, -1) < seq, "order per key broken"
                last[key] = seq
                await message.ack()
                got += 1
                if got == counts[p]:
                    break
    assert len(last) == 17


# --- the orders app end to end ----------------------------------------------------------


async def wait_drained(amqp: str, ns: str, worker: WorkerProc, stalled_s: float = 60) -> None:
    """Until every partition queue of the orders topic has no ready message and the
    worker's partitions are idle, twice in a row: a ready count of 0 alone says nothing
    of the messages the broker pushed to the worker (prefetch) and it has not acked.
    Fails once neither the ready count nor the worker's partitions moved for ``stalled_s``."""
    seen: dict[str, Any] = {"quiet": 0, "ready": -1, "status": None}

    async def drained() -> bool:
        assert worker.alive, f"worker died:\n{worker.log_text()[-3000:]}"
        status = await worker.status()
        idle = status is not None and not any(p["busy"] for p in status["partitions"].values())
        ready = sum([await depth(amqp, f"{ns}orders.{p}") for p in range(8)])
        seen.update(ready=ready, status=status)
        seen["quiet"] = seen["quiet"] + 1 if idle and not ready else 0
        return bool(seen["quiet"] >= 2)

    await until(
        drained,
        what=f"the queues of {ns}orders drained",
        progress=lambda: (seen["ready"], partitions_of([seen["status"]])),
        stalled_s=stalled_s,
        poll_s=0.5,
        detail=lambda: worker.log_text()[-3000:],
    )


async def test_orders_app_on_rabbitmq_exact_after_kill_and_restart(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"ro{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(amqp, STREAMAPP_EVENT_STORE=store, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    events, expected = order_events(300, 6000)
    first, second = events[:2000], events[2000:]
    await append_to_store(store, first)

    def worker() -> WorkerProc:
        return WorkerProc(
            "127.0.0.1:1", ns, tmp_path / "data", tmp_path / "w.log", extra_env=env
        ).start()

    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app", "--chunk", "200"),
        "127.0.0.1:1",
        ns,
        tmp_path / "fwd.log",
        extra_env=env,
    ).start()
    w = worker()
    try:
        await wait_ready(w)
        appending = asyncio.create_task(_append_slowly(store, second))
        await asyncio.sleep(1.0)
        w.kill()  # mid-load: unacked deliveries go back to the queues
        w = worker()
        await appending
        await wait_ready(w)
        await until(  # drained means nothing: the forwarder is done first
            lambda: "..6000" in forwarder.log_text(),  # its first line or a summary
            what="the forwarder at position 6000",
            progress=lambda: len(forwarder.log_text()),
            poll_s=0.2,
            detail=lambda: forwarder.log_text()[-2000:],
        )
        await wait_drained(amqp, ns, w)
        await wait_exact([w], expected)
        assert w.stop() == 0
        assert sum([await depth(amqp, f"{ns}orders.{p}") for p in range(8)]) == 0  # all acked
        assert "Traceback" not in w.log_text()
    finally:
        forwarder.kill()
        if w.alive:
            w.kill()


async def _append_slowly(store: str, events: list[Event]) -> None:
    for i in range(0, len(events), 500):
        await append_to_store(store, events[i : i + 500])
        await asyncio.sleep(0.2)


# --- refusal and reconnection ------------------------------------------------------------


async def test_tables_without_history_or_local_state_are_refused_loudly(
    amqp: str, tmp_path: Path
) -> None:
    from streamapp import ConfigError, Table, TableView
    from streamapp.worker import Worker

    ns = f"rn{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", broker="rabbitmq", amqp_url=amqp, data_dir=tmp_path, web_port=0)
    seen: Table[int] = Table("seen")

    @app.agent(app.topic(f"{ns}in", partitions=1), tables=[seen])
    async def count(event: Event, view: TableView[int]) -> None:
        pass

    settings = app.settings()
    await create_topology(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.source is not None
        with pytest.raises(ConfigError, match=r"declare history=FromEventStore\(\)"):
            await finished(
                worker.source.wait(),
                what="the source refused",
                progress=lambda: source_progress(worker.source),
            )
    finally:
        await worker.stop()


async def test_reconnect_redelivers_in_flight_deliveries_and_state_applies_once(
    amqp: str, tmp_path: Path
) -> None:
    from urllib.parse import urlsplit

    from tests.contract.rabbit_harness import RabbitHarness
    from tests.contract.test_agent_contract import ev, log_app, logged

    parts = urlsplit(amqp)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    port = await proxy.start()
    h = RabbitHarness(f"amqp://guest:guest@127.0.0.1:{port}/", tmp_path)

    async def slow(event: Event, view: object) -> None:
        await asyncio.sleep(0.01)

    try:
        await h.start(log_app(h, partitions=2, fail=slow))
        keys = ("a", "b", "c")
        names = {k: [f"{k}{v}" for v in range(1, 61)] for k in keys}
        for v in range(60):
            for k in keys:
                await h.send(ev(k, names[k][v], version=v + 1))

        def calls() -> int:
            return sum(h.calls.values())

        await until(lambda: calls() >= 30, what="30 calls", progress=calls, poll_s=0.01)
        proxy.cut()  # deliveries in hand and in flight die with the channel
        tables: dict[str, Any] = {}

        async def all_applied() -> bool:
            tables.update({k: await h.table("log", k) for k in keys})
            return all(t and t["n"] == 60 for t in tables.values())

        await until(
            all_applied, what="60 applied on every key", progress=lambda: frozen(tables), poll_s=0.2
        )
        assert tables == {k: logged(*names[k]) for k in keys}  # once each, in order
        await until(  # the robust client reconnects (after ~5 s)
            lambda: h.redelivered() > 0, what="a redelivery", stalled_s=30
        )
        assert await h.settle(30)  # the redelivered ones are acked on the new channel
        assert {k: await h.table("log", k) for k in keys} == tables  # and applied once
        await h.stop()
        assert sum([await depth(amqp, f"{h.topic}.{p}") for p in range(2)]) == 0
    finally:
        await h.stop()
        await proxy.stop()


async def test_with_reconnect_off_a_lost_connection_stops_the_worker_loudly(
    amqp: str, tmp_path: Path
) -> None:
    from urllib.parse import urlsplit

    from streamapp.errors import SourceError
    from tests.contract.rabbit_harness import RabbitHarness
    from tests.contract.test_agent_contract import ev, log_app

    parts = urlsplit(amqp)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    port = await proxy.start()
    h = RabbitHarness(f"amqp://guest:guest@127.0.0.1:{port}/", tmp_path)
    try:
        app = log_app(h, partitions=2)
        app._overrides["amqp_reconnect"] = False
        await h.start(app)
        await h.send(ev("a", "a1", version=1))
        assert await h.settle(30)
        assert h.worker is not None
        source = h.worker.source
        assert source is not None
        proxy.cut()
        with pytest.raises(
            SourceError, match=r"amqp_reconnect \(STREAMAPP_AMQP_RECONNECT\) is off"
        ):
            await finished(source.wait(), what="the source failed", progress=h.progress)
    finally:
        await h.stop()
        await proxy.stop()
