"""Benchmark: live latency of the orders projection at a fixed rate, publish to view.

One in-process worker of the orders app (8 partitions, transactional changelog) on a
fresh topic. Once every partition is live, a publisher in its own process (as a real
publisher is: it does not share the worker's event loop) sends events at a fixed rate
(default 2,000 events/s, over 1,000 orders, each with its stream version). For one event
in ``--sample``, the latency is the time from the ``send`` call to the moment the
committed store holds its order at that version: what ``GET /tables/order_status/{key}``
answers from (the committed state, never an open batch), read in-process every
millisecond without HTTP. Both processes read ``time.monotonic()`` (CLOCK_MONOTONIC, one
clock for the whole machine). Prints p50/p99 in ms; ``--json`` writes them. Not a test:
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
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, Park  # noqa: E402
from streamapp.codecs import kafka as codec  # noqa: E402
from streamapp.engine.phase import Phase  # noqa: E402
from streamapp.transports.kafka.topology import create_topics  # noqa: E402
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
            publisher = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--publish",
                topic,
                "--bootstrap",
                bootstrap,
                "--rate",
                str(rate),
                "--seconds",
                str(seconds),
                "--orders",
                str(orders),
                "--sample",
                str(sample),
                stdout=asyncio.subprocess.PIPE,
            )
            assert publisher.stdout is not None
            achieved = 0.0

            async def read() -> None:
                nonlocal achieved
                assert publisher.stdout is not None
                async for line in publisher.stdout:
                    oid, version, sent = line.split()
                    if oid == b"achieved":
                        achieved = float(sent)
                    elif oid.decode() not in pending:
                        pending[oid.decode()] = (int(version), float(sent))

            reader = asyncio.create_task(read())
            drained_by: float | None = None  # once the publisher is done: 60 s to drain
            while not reader.done() or pending:
                now = time.monotonic()
                if reader.done():
                    drained_by = drained_by or now + 60
                    if now > drained_by:
                        raise RuntimeError(f"{len(pending)} sampled events not applied in 60 s")
                for key, (version, sent) in list(pending.items()):
                    _, task = assignment.owner_of("order_status", key)
                    ptables = None if task is None else task.state.tables_for("order_status")
                    assert ptables is not None, f"{key}: its partition is not served here"
                    if ptables.committed_version(key) >= version:
                        latencies.append(now - sent)
                        del pending[key]
                await asyncio.sleep(0.001)
            await reader
            if await publisher.wait() != 0:
                raise RuntimeError("the publisher failed")
            inside = {
                name: _mean(worker.metrics.registry, name)
                for name in (
                    "streamapp_batch_size",
                    "streamapp_batch_duration_seconds",
                    "streamapp_commit_duration_seconds",
                )
            }
        finally:
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
        "batches": int(inside["streamapp_batch_size"][1]),
        "mean_batch_size": round(inside["streamapp_batch_size"][0], 1),
        "mean_batch_ms": round(inside["streamapp_batch_duration_seconds"][0] * 1000, 2),
        "mean_commit_ms": round(inside["streamapp_commit_duration_seconds"][0] * 1000, 2),
    }


def _mean(registry: CollectorRegistry, name: str) -> tuple[float, float]:
    """The mean and count of a histogram of agent ``p`` in the worker's metrics."""
    total = registry.get_sample_value(f"{name}_sum", {"agent": "p"}) or 0.0
    count = registry.get_sample_value(f"{name}_count", {"agent": "p"}) or 0.0
    return (total / count if count else 0.0), count


async def publish(
    bootstrap: str, topic: str, rate: int, seconds: float, orders: int, sample: int
) -> None:
    """The publisher process: sends at ``rate`` on a fixed schedule; for one event in
    ``sample`` prints ``order version sent_at`` (monotonic seconds), then ``achieved``."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0
    )
    await producer.start()
    try:
        total = int(rate * seconds)
        tick = 0.005  # send rate * tick events every 5 ms, on a fixed schedule
        per_tick = max(1, round(rate * tick))
        versions = [0] * orders
        started = time.monotonic()
        for i in range(total):
            if i % per_tick == 0:
                due = started + (i // per_tick) * tick
                await asyncio.sleep(max(0.0, due - time.monotonic()))
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
            sent = time.monotonic()
            await producer.send(topic, value, key=key, headers=headers)
            if i % sample == 0:
                print(oid, versions[n], repr(sent), flush=True)
        achieved = total / (time.monotonic() - started)
        await producer.flush()
        print("achieved 0", achieved, flush=True)
    finally:
        await producer.stop()


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
    parser.add_argument("--publish", metavar="TOPIC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        asyncio.run(
            publish(args.bootstrap, args.publish, args.rate, args.seconds, args.orders, args.sample)
        )
        return
    out = asyncio.run(measure(args.bootstrap, args.rate, args.seconds, args.orders, args.sample))
    print(
        f"publish-to-view at {out['rate']:,} events/s (achieved {out['achieved_rate']:,.0f}), "
        f"{out['samples']} samples: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, "
        f"max {out['max_ms']} ms; inside the worker: {out['batches']} batches of "
        f"{out['mean_batch_size']} events, {out['mean_batch_ms']} ms to run and "
        f"{out['mean_commit_ms']} ms to commit on average"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
