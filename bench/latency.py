"""Benchmark: live latency of the orders projection at a fixed rate, publish to view.

One in-process worker of the orders app (8 partitions, transactional changelog) on a
fresh topic. Once every partition is live, events are published at a fixed rate
(default 2,000 events/s, over 1,000 orders, each with its stream version). For one event
in ``--sample``, the latency is the time from the ``send`` call to the moment the
committed store holds its order at that version: what ``GET /tables/order_status/{key}``
answers from (the committed state, never an open batch), read in-process every
millisecond without HTTP. Prints p50/p99 in ms; ``--json`` writes them. Not a test:
nothing asserts a timing.

    .venv/bin/python bench/latency.py [--rate 2000] [--seconds 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, Park  # noqa: E402
from streamapp.engine.phase import Phase  # noqa: E402
from streamapp.kafka import codec  # noqa: E402
from streamapp.kafka.topics import create_topics  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8
KINDS = ("placed", "paid", "shipped", "cancelled")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def measure(
    bootstrap: str, rate: int, seconds: float, orders: int, sample: int
) -> dict[str, float | int]:
    topic = f"bench-latency-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="streamapp-latency-") as data_dir:
        app = App(
            f"bench-lat-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap=bootstrap,
            data_dir=data_dir,
            web_port=0,
        )
        source = app.topic(topic, partitions=PARTITIONS)
        app.agent(source, tables=[order_status], on_failure=Park(f"{topic}.parked"), name="p")(
            project_order_status.handler
        )
        settings = app.settings()
        await create_topics(app, settings)
        worker = Worker(app, settings)
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0
        )
        await producer.start()
        await worker.start()
        try:
            assert worker.source is not None
            assignment = worker.source.assignment
            for _ in range(6000):  # the group forms and every partition goes live (60 s)
                tasks = assignment.tasks
                if len(tasks) == PARTITIONS and all(t.phase is Phase.LIVE for t in tasks.values()):
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("the worker's partitions did not go live in 60 s")
            pending: dict[str, tuple[int, float]] = {}  # order -> (version, sent at)
            latencies: list[float] = []
            sending = True

            async def watch() -> None:
                while sending or pending:
                    now = time.perf_counter()
                    for key, (version, sent) in list(pending.items()):
                        _, task = assignment.owner_of("order_status", key)
                        ptables = None if task is None else task.tables_for("order_status")
                        assert ptables is not None, f"{key}: its partition is not served here"
                        if ptables.committed_version(key) >= version:
                            latencies.append(now - sent)
                            del pending[key]
                    await asyncio.sleep(0.001)

            watcher = asyncio.create_task(watch())
            total = int(rate * seconds)
            tick = 0.005  # send rate * tick events every 5 ms, on a fixed schedule
            per_tick = max(1, round(rate * tick))
            versions = [0] * orders
            started = time.perf_counter()
            for i in range(total):
                if i % per_tick == 0:
                    due = started + (i // per_tick) * tick
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                n = i % orders
                versions[n] += 1
                oid = f"order-{n:05d}"
                event = Event.create(
                    f"order.{KINDS[min(versions[n] - 1, 3)]}",
                    stream_id=oid,
                    version=versions[n],
                    source="bench",
                    data={"order": oid, "amount": i % 997, "currency": "EUR"},
                )
                key, value, headers = codec.encode(event)
                sent = time.perf_counter()
                await producer.send(topic, value, key=key, headers=headers)
                if i % sample == 0 and oid not in pending:
                    pending[oid] = (versions[n], sent)
            achieved = total / (time.perf_counter() - started)
            await producer.flush()
            sending = False
            await asyncio.wait_for(watcher, 60)
        finally:
            await producer.stop()
            await worker.stop()
    latencies.sort()
    return {
        "rate": rate,
        "achieved_rate": round(achieved, 1),
        "seconds": seconds,
        "samples": len(latencies),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="events/s published")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=10, help="measure 1 event in N")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    out = asyncio.run(measure(args.bootstrap, args.rate, args.seconds, args.orders, args.sample))
    print(
        f"publish-to-view at {out['rate']:,} events/s (achieved {out['achieved_rate']:,.0f}), "
        f"{out['samples']} samples: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, "
        f"max {out['max_ms']} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
