"""Benchmark: the order_status projection in streamapp, Quix Streams and faust-streaming,
and a raw aiokafka consumer, on the same broker and the same data, in one run.

Rounds alternate the contenders; the report gives events/s medians and ratios (machines
here are noisy: compare ratios, never a bare time). Not a test: nothing here asserts a
timing. streamapp always commits its changelog in Kafka transactions, so the rivals run
in their exactly-once modes too (``--rival-guarantee`` to change). faust-streaming is
two orders of magnitude slower, so it reads only the first ``--faust-events`` events.

    scripts/bench            # or: .venv/bin/python bench/orders_projection.py --events 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rivals import check  # noqa: E402  (bench/: the one per-order check of every contender)

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, EventTypes, Park, TableView  # noqa: E402
from streamapp.codecs import kafka as codec  # noqa: E402
from streamapp.kafka.topology import create_topics  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8


async def produce(bootstrap: str, topic: str, n_events: int, n_orders: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=10
    )
    await producer.start()
    try:
        futures = []
        kinds = ("placed", "paid", "shipped", "cancelled")
        for i in range(n_events):
            oid = f"order-{i % n_orders:05d}"
            event = Event.create(
                f"order.{kinds[(i // n_orders) % 4]}",
                stream_id=oid,
                source="bench",
                data={"order": oid, "amount": i % 997, "currency": "EUR"},
            )
            key, value, headers = codec.encode(event)
            futures.append(await producer.send(topic, value, key=key, headers=headers))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_aiokafka(bootstrap: str, topic: str, n_events: int) -> float:
    """events/s of a plain consumer that decodes nothing: the ceiling of the client."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        seen, first, started, asked = 0, 0, 0.0, 0.0
        while seen < n_events:
            asked = time.perf_counter()
            batch = await consumer.getmany(timeout_ms=500)
            n = sum(len(recs) for recs in batch.values())
            if n and not seen:
                started, first = time.perf_counter(), n  # count from the first fetch on
            seen += n
        if seen == first:  # a small topic, read in one fetch: time that fetch
            return seen / (time.perf_counter() - asked)
        return (seen - first) / (time.perf_counter() - started)
    finally:
        await consumer.stop()


class Order(msgspec.Struct):
    """The bench's order event data, as a model (``--one streamapp-typed``)."""

    order: str
    amount: int
    currency: str


class Placed(Order): ...


class Paid(Order): ...


class Shipped(Order): ...


class Cancelled(Order): ...


ORDER_TYPES = EventTypes(
    {"order.placed": Placed, "order.paid": Paid, "order.shipped": Shipped,
     "order.cancelled": Cancelled}
)  # fmt: skip
"""One model per type, the same fields (a typed send tells types apart by model)."""


async def project_dict(event: Event, statuses: TableView[Any]) -> None:
    """order_status, plus the sum of the events' amounts read from dict data."""
    oid = event.stream_id
    assert oid is not None
    current = statuses.get(oid)
    statuses[oid] = {
        "status": event.type.removeprefix("order."),
        "version": (current["version"] if current else 0) + 1,
        "last_event_id": event.id,
        "total": (current["total"] if current else 0) + event.data["amount"],
        "currency": event.data["currency"],
    }


async def project_typed(event: Event[Order], statuses: TableView[Any]) -> None:
    """The same fold, the data decoded into a msgspec model."""
    oid = event.stream_id
    assert oid is not None
    current = statuses.get(oid)
    data = event.data
    statuses[oid] = {
        "status": event.type.removeprefix("order."),
        "version": (current["version"] if current else 0) + 1,
        "last_event_id": event.id,
        "total": (current["total"] if current else 0) + data.amount,
        "currency": data.currency,
    }


async def streamapp_worker(
    bootstrap: str, topic: str, n_events: int, n_orders: int, data_dir: str, kind: str
) -> float:
    """events/s of the reference projection (order_status) in one worker, with its
    transactional changelog, RocksDB writes and offset commits; ``kind``
    ``streamapp-dict`` and ``streamapp-typed`` also read each event's data (dicts, or
    msgspec models)."""
    app = App(
        f"bench-{uuid.uuid4().hex[:8]}", kafka_bootstrap=bootstrap, data_dir=data_dir, web_port=0
    )
    source = app.topic(topic, partitions=PARTITIONS)
    parked = Park(f"{topic}.parked")
    if kind == "streamapp-typed":
        app.agent(
            source, tables=[order_status], on_failure=parked, name="project", events=ORDER_TYPES
        )(project_typed)
    elif kind == "streamapp-dict":
        app.agent(source, tables=[order_status], on_failure=parked, name="project")(project_dict)
    else:
        app.agent(source, tables=[order_status], on_failure=parked, name="project")(
            project_order_status.handler
        )
    settings = app.settings()
    await create_topics(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        started, base = None, 0
        while True:
            assert worker.source is not None
            done = sum(t.counts.processed for t in worker.source.assignment.tasks.values())
            if started is None and done:
                started, base = time.perf_counter(), done
            if done >= n_events:
                break
            await asyncio.sleep(0.01)
        assert started is not None
        rate = (done - base) / (time.perf_counter() - started)
        await check_committed(worker, n_events, n_orders)
        return rate
    finally:
        await worker.stop()


def committed_state(worker: Worker) -> dict[str, Any]:
    """order id -> its order_status row, read from every partition's committed table."""
    assert worker.source is not None
    state: dict[str, Any] = {}
    for task in worker.source.assignment.tasks.values():
        tables = task.tables_for("order_status")
        if tables is not None:
            state.update((str(k), v) for k, v in tables.view("order_status").items())
    return state


async def check_committed(
    worker: Worker, n_events: int, n_orders: int, timeout_s: float = 60
) -> None:
    """The committed tables hold every order with version == its event count, the same
    per-order check as every rival's (``rivals.check``), out of the timing. Raises if
    they do not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        exact, note = check(committed_state(worker), n_events, n_orders)
        if exact:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"streamapp's committed state is not exact: {note}")
        await asyncio.sleep(0.2)


async def one(kind: str, bootstrap: str, topic: str, n_events: int, n_orders: int) -> None:
    """Run raw aiokafka or streamapp once over ``topic`` and print {"rate": ev/s}: the
    harness runs every contender so, each in a fresh process."""
    if kind == "raw":
        rate = await raw_aiokafka(bootstrap, topic, n_events)
    else:
        with tempfile.TemporaryDirectory(prefix="streamapp-bench-") as data_dir:
            rate = await streamapp_worker(bootstrap, topic, n_events, n_orders, data_dir, kind)
    print(json.dumps({"rate": round(rate, 1), "exact": True}), flush=True)


def rival(
    name: str,
    bootstrap: str,
    topic: str,
    events: int,
    orders: int,
    flags: Sequence[str] = (),
    timeout_s: float = 900,
    topic_events: int | None = None,
) -> tuple[float | None, str | None]:
    """(events/s, warning) of one rival, run by bench/rivals.py in its own process, over
    the first ``events`` of the topic's ``topic_events``; ``flags`` are rivals.py's
    (``--exactly-once``, ``--recovery``)."""
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "rivals.py"),
        name,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--events",
        str(events),
        "--orders",
        str(orders),
        "--topic-events",
        str(topic_events or events),
        *flags,
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"failed: {tail} (is the bench extra installed? pip install -e .[bench])"
    result = json.loads(lines[-1])
    warning = None if result.get("exact") else f"final state not exact: {result.get('note')}"
    return float(result["rate"]), warning


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--orders", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rivals", default="quix,faust", help="comma list, or 'none'")
    parser.add_argument("--faust-events", type=int, default=20_000)
    parser.add_argument(
        "--rival-guarantee", choices=("exactly-once", "at-least-once"), default="exactly-once"
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument(
        "--one",
        choices=("raw", "streamapp", "streamapp-dict", "streamapp-typed"),
        help="one run over --topic",
    )
    parser.add_argument("--topic", help="with --one: an existing topic of --events events")
    args = parser.parse_args()
    if args.one:
        await one(args.one, args.bootstrap, args.topic, args.events, args.orders)
        return

    topic = f"bench-orders-{uuid.uuid4().hex[:8]}"
    print(f"producing {args.events} order events over {args.orders} orders to {topic} ...")
    await produce(args.bootstrap, topic, args.events, args.orders)
    rivals = [r for r in args.rivals.split(",") if r and r != "none"]
    results: dict[str, list[float]] = {"raw aiokafka": [], "streamapp": []}
    problems: dict[str, str] = {}
    for r in range(args.rounds):
        results["raw aiokafka"].append(await raw_aiokafka(args.bootstrap, topic, args.events))
        with tempfile.TemporaryDirectory(prefix="streamapp-bench-") as data_dir:
            results["streamapp"].append(
                await streamapp_worker(args.bootstrap, topic, args.events, args.orders, data_dir)
            )
        for name in rivals:
            n = min(args.events, args.faust_events) if name == "faust" else args.events
            flags = ["--exactly-once"] if args.rival_guarantee == "exactly-once" else []
            rate, warning = rival(
                name, args.bootstrap, topic, n, args.orders, flags, topic_events=args.events
            )
            if warning:
                problems[name] = warning
            if rate is not None:
                results.setdefault(name, []).append(rate)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f} ev/s" for k, v in results.items()))
    medians = {k: statistics.median(v) for k, v in results.items() if v}
    raw = medians["raw aiokafka"]
    mine = medians["streamapp"]
    print()
    print(f"{'consumer':<14} {'median ev/s':>12} {'/ raw':>7} {'streamapp /':>12}   rounds")
    for name, values in results.items():
        med = medians[name]
        print(
            f"{name:<14} {med:>12,.0f} {med / raw:>7.2f} {mine / med:>12.2f}   "
            + " ".join(f"{v:,.0f}" for v in values)
        )
    for name, why in problems.items():
        print(f"{name:<14} warning: {why}")
    ratio = mine / raw
    print(f"ratio streamapp / raw aiokafka: {ratio:.2f}  (rivals: {args.rival_guarantee})")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"orders-projection-{stamp}.json").write_text(
        json.dumps(
            {
                "events": args.events,
                "orders": args.orders,
                "rounds": results,
                "medians": medians,
                "ratio": ratio,
                "rival_guarantee": args.rival_guarantee,
                "problems": problems,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
