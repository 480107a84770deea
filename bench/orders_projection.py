"""Benchmark: the order_status projection on one worker vs a raw aiokafka consumer.

Both read the same topic on the same broker in the same run, alternating rounds; the
report gives events/s medians and the ratio (machines here are noisy: compare ratios,
never a bare time). Not a test: nothing here asserts a timing.

    scripts/bench            # or: .venv/bin/python bench/orders_projection.py --events 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, Park  # noqa: E402
from streamapp.kafka import codec  # noqa: E402
from streamapp.kafka.topics import create_topics  # noqa: E402
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
        seen, first, started = 0, 0, 0.0
        while seen < n_events:
            batch = await consumer.getmany(timeout_ms=500)
            n = sum(len(recs) for recs in batch.values())
            if n and not seen:
                started, first = time.perf_counter(), n  # count from the first fetch on
            seen += n
        return (seen - first) / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def streamapp_worker(bootstrap: str, topic: str, n_events: int, data_dir: str) -> float:
    """events/s of the reference projection (order_status) in one worker, with its
    transactional changelog, RocksDB writes and offset commits."""
    app = App(
        f"bench-{uuid.uuid4().hex[:8]}", kafka_bootstrap=bootstrap, data_dir=data_dir, web_port=0
    )
    source = app.topic(topic, partitions=PARTITIONS)
    app.agent(source, tables=[order_status], on_failure=Park(f"{topic}.parked"), name="project")(
        project_order_status.handler
    )
    settings = app.settings()
    await create_topics(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        started, base = None, 0
        while True:
            done = sum(p["processed"] for p in worker.source.status().values())
            if started is None and done:
                started, base = time.perf_counter(), done
            if done >= n_events:
                break
            await asyncio.sleep(0.01)
        assert started is not None
        return (done - base) / (time.perf_counter() - started)
    finally:
        await worker.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--orders", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()

    topic = f"bench-orders-{uuid.uuid4().hex[:8]}"
    print(f"producing {args.events} order events over {args.orders} orders to {topic} ...")
    await produce(args.bootstrap, topic, args.events, args.orders)
    results: dict[str, list[float]] = {"raw aiokafka": [], "streamapp": []}
    for r in range(args.rounds):
        results["raw aiokafka"].append(await raw_aiokafka(args.bootstrap, topic, args.events))
        with tempfile.TemporaryDirectory(prefix="streamapp-bench-") as data_dir:
            results["streamapp"].append(
                await streamapp_worker(args.bootstrap, topic, args.events, data_dir)
            )
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f} ev/s" for k, v in results.items()))
    medians = {k: statistics.median(v) for k, v in results.items()}
    ratio = medians["streamapp"] / medians["raw aiokafka"]
    print()
    print(f"{'consumer':<14} {'median ev/s':>12}   rounds")
    for name, values in results.items():
        print(f"{name:<14} {medians[name]:>12,.0f}   " + " ".join(f"{v:,.0f}" for v in values))
    print(f"ratio streamapp / raw aiokafka: {ratio:.2f}")
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
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
