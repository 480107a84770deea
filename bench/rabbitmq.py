"""Benchmark: streamapp on RabbitMQ against raw aio-pika, side by side, in one run.

(a) consume: the order_status projection of the orders app fed by streamapp's RabbitSource
    (tables in RocksDB, per-batch WriteBatch with the checkpoint, then one ack per batch)
    against a raw aio-pika consumer on the same partition queues, with manual acks (one per
    message) and the same prefetch, doing comparable work: decode the CloudEvent headers
    and its JSON data, read and update the order's row in a dict. Before each run the
    queues are filled with the same messages (built by the sink's own encoder); a run
    drains them. Rates count from the first processed event on. After each run, out of the
    timing, both final states are checked per order (``rivals.check``).
(b) publish: confirmed publishing with RabbitSink.publish_many (every message in flight,
    then all confirms awaited) against sequential publish-and-wait (RabbitSink.publish,
    one confirm awaited per message), on the same messages.

Rounds alternate the contenders; the report gives medians and ratios (the machines here
are shared and noisy: compare ratios, never a bare rate). Not a test: nothing asserts.

    .venv/bin/python bench/rabbitmq.py [--events 50000] [--publish 3000] [--rounds 3]

RabbitMQ at ``STREAMAPP_AMQP_URL`` (default the local guest broker).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aio_pika
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orders_projection import committed_state  # noqa: E402  (bench/)
from rivals import check  # noqa: E402  (bench/: the one per-order check of every contender)

from agents.orders import ORDER_EVENTS, project_order_status  # noqa: E402
from streamapp import App, Event, FromEventStore, Park  # noqa: E402
from streamapp.codecs import amqp as codec  # noqa: E402
from streamapp.records import Message  # noqa: E402
from streamapp.topics import partition_for  # noqa: E402
from streamapp.transports.rabbitmq.members import members_exchange  # noqa: E402
from streamapp.transports.rabbitmq.sink import RabbitSink  # noqa: E402
from streamapp.transports.rabbitmq.topology import create_topology, queue_name  # noqa: E402
from streamapp.transports.rabbitmq.wire import to_message  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8


def order_messages(topic: str, n_events: int, n_orders: int) -> list[Message]:
    """The bench's order events (as bench/orders_projection.py makes them), encoded."""
    kinds = ("placed", "paid", "shipped", "cancelled")
    out = []
    for i in range(n_events):
        oid = f"order-{i % n_orders:05d}"
        event = Event.create(
            f"order.{kinds[(i // n_orders) % 4]}",
            stream_id=oid,
            source="bench",
            data={"order": oid, "amount": i % 997, "currency": "EUR"},
        )
        key, value, headers = codec.encode(event)
        out.append(Message(topic, value, key, headers))
    return out


def app_for(amqp: str, topic: str, data_dir: str) -> App:
    """The orders projection on RabbitMQ semantics: tables, history (an empty store, so
    the catch-up is instant, as for any RabbitMQ app with tables), parking."""
    app = App(
        f"bench-rmq-{uuid.uuid4().hex[:8]}",
        broker="rabbitmq",
        amqp_url=amqp,
        data_dir=data_dir,
        event_store=f"sqlite:///{data_dir}/events.db",
        web_port=0,
    )
    source = app.topic(topic, partitions=PARTITIONS)
    app.agent(
        source,
        tables=[order_status],
        on_failure=Park(f"{topic}.parked"),
        history=FromEventStore(),
        name="project",
    )(project_order_status.handler)
    return app


async def depths(amqp: str, topic: str) -> list[int]:
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        out = []
        for p in range(PARTITIONS):
            queue = await channel.declare_queue(queue_name(topic, p), passive=True)
            out.append(queue.declaration_result.message_count or 0)
        return out
    finally:
        await connection.close()


async def fill(amqp: str, topic: str, messages: list[Message]) -> None:
    """Put ``messages`` in the partition queues (unconfirmed publishes, then wait until
    the queues hold them all): the same bytes, headers and routing as the sink's."""
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel(publisher_confirms=False)
        exchange = await channel.get_exchange(topic)
        for m in messages:
            routing = partition_for(m.key, PARTITIONS) if m.key is not None else 0
            await exchange.publish(to_message(m.value, m.key, m.headers), str(routing))
    finally:
        await connection.close()
    deadline = time.monotonic() + 120
    while sum(await depths(amqp, topic)) < len(messages):
        if time.monotonic() > deadline:
            raise RuntimeError(f"queues of {topic} not filled after 120 s")
        await asyncio.sleep(0.1)


def exact_or_raise(who: str, state: dict[str, Any], n_events: int, n_orders: int) -> None:
    """Every order's version equals its event count (``rivals.check``), or RuntimeError."""
    exact, note = check(state, n_events, n_orders)
    if not exact:
        raise RuntimeError(f"{who}: final state not exact: {note}")


async def raw_consumer(amqp: str, topic: str, n_events: int, n_orders: int, prefetch: int) -> Run:
    """Plain aio-pika consumers, one channel per partition queue, manual acks."""
    state: dict[str, dict[str, Any]] = {}
    seen = 0
    started = cpu = 0.0
    done: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal seen, started, cpu
        headers = message.headers
        ce_type = str(headers["cloudEvents_type"])
        if ce_type not in ORDER_EVENTS:
            raise ValueError(f"unknown order event type {ce_type!r}")
        order_id = str(headers["streamapp-key"])
        _data = orjson.loads(message.body)  # the event's data (unused by the projection)
        current = state.get(order_id)
        state[order_id] = {
            "status": ce_type.removeprefix("order."),
            "version": (current["version"] if current else 0) + 1,
            "last_event_id": str(headers["cloudEvents_id"]),
        }
        await message.ack()
        seen += 1
        if seen == 1:
            started, cpu = time.perf_counter(), time.process_time()
        elif seen == n_events and not done.done():
            done.set_result((time.perf_counter(), time.process_time()))

    connection = await aio_pika.connect(amqp)
    try:
        for p in range(PARTITIONS):
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.declare_queue(queue_name(topic, p), passive=True)
            await queue.consume(on_message, no_ack=False)
        ended, cpu_ended = await asyncio.wait_for(done, 600)
    finally:
        await connection.close()
    exact_or_raise("raw aio-pika", state, n_events, n_orders)
    return Run(n_events - 1, ended - started, cpu_ended - cpu)


async def streamapp_worker(amqp: str, topic: str, n_events: int, n_orders: int) -> Run:
    """The orders projection in one in-process worker (its own fresh app and tables)."""
    with tempfile.TemporaryDirectory(prefix="streamapp-rmq-bench-") as data_dir:
        app = app_for(amqp, topic, data_dir)
        settings = app.settings()
        await create_topology(app, settings)  # this app's group exchange (topics exist)
        worker = Worker(app, settings)
        await worker.start()
        try:
            assert worker.source is not None
            started, cpu, base, done = 0.0, 0.0, 0, 0
            deadline = time.monotonic() + 600
            while done < n_events:
                done = sum(t.counts.processed for t in worker.source.assignment.tasks.values())
                if not base and done:
                    started, cpu, base = time.perf_counter(), time.process_time(), done
                if time.monotonic() > deadline:
                    raise RuntimeError(f"streamapp processed {done}/{n_events} in 600 s")
                await asyncio.sleep(0.01)
            run = Run(done - base, time.perf_counter() - started, time.process_time() - cpu)
            await settled_exact(worker, n_events, n_orders)  # out of the timing
        finally:
            await worker.stop()
            await drop_topology(amqp, [], exchanges=[members_exchange(app)])
    return run


async def settled_exact(worker: Worker, n_events: int, n_orders: int, within_s: float = 60) -> None:
    """Until the committed tables hold every order exactly (the batch in hand commits
    after ``processed`` counts it); RuntimeError naming what is off after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not check(committed_state(worker), n_events, n_orders)[0]:
        if time.monotonic() > deadline:
            exact_or_raise("streamapp RabbitSource", committed_state(worker), n_events, n_orders)
        await asyncio.sleep(0.1)


async def publish_runs(
    sink: RabbitSink, amqp: str, topic: str, messages: list[Message]
) -> dict[str, Run]:
    """publish_many, and sequential publish-and-wait, over ``messages``."""

    async def many() -> None:
        await sink.publish_many(messages)

    async def sequential() -> None:
        for m in messages:
            await sink.publish(m.topic, m.value, key=m.key, headers=m.headers)

    out = {}
    runs: dict[str, Callable[[], Awaitable[None]]] = {
        "publish_many": many,
        "sequential": sequential,
    }
    for name, run in runs.items():
        started, cpu = time.perf_counter(), time.process_time()
        await run()
        out[name] = Run(len(messages), time.perf_counter() - started, time.process_time() - cpu)
        await purge(amqp, topic)
    return out


async def purge(amqp: str, topic: str) -> None:
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        for p in range(PARTITIONS):
            queue = await channel.declare_queue(queue_name(topic, p), passive=True)
            await queue.purge()
    finally:
        await connection.close()


async def drop_topology(amqp: str, topics: list[str], exchanges: Sequence[str] = ()) -> None:
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        for topic in topics:
            for p in range(PARTITIONS):
                await channel.queue_delete(queue_name(topic, p))
            await channel.exchange_delete(topic)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


@dataclasses.dataclass
class Table:
    """Runs per contender; medians of rate and of CPU per item, with their ratios."""

    runs: dict[str, list[Run]] = dataclasses.field(default_factory=dict)

    def add(self, name: str, run: Run) -> None:
        self.runs.setdefault(name, []).append(run)

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "rate": statistics.median(r.rate for r in runs),
                "cpu_us": statistics.median(r.cpu_us for r in runs),
            }
            for name, runs in self.runs.items()
        }

    def show(self, title: str, unit: str, base: str) -> None:
        med = self.medians()
        rate0, cpu0 = med[base]["rate"], med[base]["cpu_us"]
        print(f"\n{title}: medians of {len(self.runs[base])} rounds")
        print(
            f"{'contender':<24} {unit:>9} {'/ ' + base:>16} {'cpu us/item':>12} "
            f"{'cpu ' + base + ' /':>18}   {unit} per round"
        )
        for name, runs in self.runs.items():
            m = med[name]
            print(
                f"{name:<24} {m['rate']:>9,.0f} {m['rate'] / rate0:>16.2f} {m['cpu_us']:>12,.0f} "
                f"{cpu0 / m['cpu_us']:>18.2f}   " + " ".join(f"{r.rate:,.0f}" for r in runs)
            )

    def paired(self, name: str, base: str) -> tuple[float, float]:
        """Medians over rounds of ``name``/``base`` rates and ``base``/``name`` CPU per item,
        each round's pair run back to back (steadier than a ratio of medians here)."""
        pairs = list(zip(self.runs[name], self.runs[base], strict=True))
        return (
            statistics.median(a.rate / b.rate for a, b in pairs),
            statistics.median(b.cpu_us / a.cpu_us for a, b in pairs),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "rounds": {k: [dataclasses.asdict(r) for r in v] for k, v in self.runs.items()},
            "medians": self.medians(),
        }


@dataclasses.dataclass(frozen=True)
class Run:
    """One contender's run: items counted, wall seconds and process CPU seconds."""

    items: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.items / self.wall_s

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per item (every thread of the process: RocksDB's too)."""
        return self.cpu_s / self.items * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--orders", type=int, default=1_000)
    parser.add_argument("--publish", type=int, default=3_000, help="messages per publish run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="where to write the figures")
    parser.add_argument(
        "--amqp", default=os.environ.get("STREAMAPP_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    args = parser.parse_args()

    ns = f"bench-rmq-{uuid.uuid4().hex[:8]}"
    topic, pub_topic = f"{ns}-orders", f"{ns}-publish"
    with tempfile.TemporaryDirectory() as tmp:
        app = app_for(args.amqp, topic, tmp)
        pub_app = app_for(args.amqp, pub_topic, tmp)
        await create_topology(app, app.settings())
        await create_topology(pub_app, pub_app.settings())
    messages = order_messages(topic, args.events, args.orders)
    pub_messages = order_messages(pub_topic, args.publish, args.orders)
    sink = RabbitSink(pub_app.settings(publish_timeout_s=120.0), {pub_topic: PARTITIONS})
    await sink.start()
    consume, publish = Table(), Table()
    prefetch = app.settings().amqp_prefetch
    try:
        print(
            f"{args.events} order events over {args.orders} orders, {PARTITIONS} partition "
            f"queues, prefetch {prefetch}; publish runs of {args.publish} messages"
        )
        for r in range(args.rounds):
            await fill(args.amqp, topic, messages)
            consume.add(
                "raw aio-pika",
                await raw_consumer(args.amqp, topic, args.events, args.orders, prefetch),
            )
            await fill(args.amqp, topic, messages)
            consume.add(
                "streamapp RabbitSource",
                await streamapp_worker(args.amqp, topic, args.events, args.orders),
            )
            left = sum(await depths(args.amqp, topic))
            if left:
                raise RuntimeError(f"streamapp left {left} messages in the queues")
            for name, value in (
                await publish_runs(sink, args.amqp, pub_topic, pub_messages)
            ).items():
                publish.add(name, value)
            latest = {k: v[-1].rate for k, v in {**consume.runs, **publish.runs}.items()}
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in latest.items()))
    finally:
        await sink.stop()
        await drop_topology(
            args.amqp,
            [topic, f"{topic}.parked", pub_topic, f"{pub_topic}.parked"],
            exchanges=[members_exchange(app), members_exchange(pub_app)],
        )

    consume.show("(a) consume + project (events/s)", "ev/s", "raw aio-pika")
    publish.show("(b) confirmed publishing (messages/s)", "msg/s", "sequential")
    cm, pm = consume.medians(), publish.medians()
    ratio = cm["streamapp RabbitSource"]["rate"] / cm["raw aio-pika"]["rate"]
    cpu_ratio = cm["raw aio-pika"]["cpu_us"] / cm["streamapp RabbitSource"]["cpu_us"]
    speedup = pm["publish_many"]["rate"] / pm["sequential"]["rate"]
    paired, paired_cpu = consume.paired("streamapp RabbitSource", "raw aio-pika")
    many_paired, _ = publish.paired("publish_many", "sequential")
    goal = "met" if ratio >= 0.95 else "NOT met"
    print(
        f"\nstreamapp / raw aio-pika: {ratio:.2f} events/s (goal >= 0.95: {goal}); "
        f"by CPU per event {cpu_ratio:.2f}; per-round pairs: {paired:.2f} events/s, "
        f"{paired_cpu:.2f} CPU"
    )
    print(f"publish_many / sequential: {speedup:.2f}; per-round pairs: {many_paired:.2f}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.json or out / f"rabbitmq-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "events": args.events,
                "orders": args.orders,
                "publish_messages": args.publish,
                "partitions": PARTITIONS,
                "prefetch": prefetch,
                "consume": {
                    **consume.as_json(),
                    "ratio_streamapp_raw": ratio,
                    "cpu_ratio_raw_streamapp": cpu_ratio,
                    "paired_ratio_streamapp_raw": paired,
                    "paired_cpu_ratio_raw_streamapp": paired_cpu,
                },
                "publish": {
                    **publish.as_json(),
                    "ratio_many_sequential": speedup,
                    "paired_ratio_many_sequential": many_paired,
                },
            },
            indent=2,
        )
    )
    print(f"written to {path}")


if __name__ == "__main__":
    asyncio.run(main())
