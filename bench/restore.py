"""Benchmark: restore of a worker's tables from their changelog, records/s.

A worker of the orders app (8 partitions, transactional changelog) projects N events
(default 100k over 10,000 orders) from a fresh topic and stops. A second worker of the
same app, with an empty data directory, then takes the partitions and restores its
RocksDB tables from the changelog before it goes live. The figure is the changelog
records it applied over the time from its first partition entering the restore to its
last going live (group join excluded). Rounds reuse the changelog, each with a fresh data
directory; the final state is checked (every order's version equals its event count).
Not a test: nothing asserts a timing.

    .venv/bin/python bench/restore.py [--events 100000] [--orders 10000] [--rounds 3]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from orders_projection import produce  # noqa: E402

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Park  # noqa: E402
from streamapp.engine.phase import Phase  # noqa: E402
from streamapp.transports.kafka.topology import create_topics  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8


def make_app(app_id: str, bootstrap: str, topic: str, data_dir: str) -> App:
    app = App(app_id, kafka_bootstrap=bootstrap, data_dir=data_dir, web_port=0)
    source = app.topic(topic, partitions=PARTITIONS)
    app.agent(source, tables=[order_status], on_failure=Park(f"{topic}.parked"), name="project")(
        project_order_status.handler
    )
    return app


async def project(app: App, n_events: int) -> None:
    """Run the projection over the topic's N events, then stop (the changelog stays)."""
    settings = app.settings()
    await create_topics(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.source is not None
        deadline = time.monotonic() + 600
        while sum(t.counts.processed for t in worker.source.assignment.tasks.values()) < n_events:
            if time.monotonic() > deadline:
                raise RuntimeError("the projection did not finish in 600 s")
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()


async def restore_once(app: App, n_events: int) -> tuple[int, float]:
    """(changelog records applied, seconds from the first restoring partition to the
    last live one) of a worker starting on an empty data directory."""
    worker = Worker(app, app.settings())
    await worker.start()
    try:
        assert worker.source is not None
        tasks = worker.source.assignment.tasks
        started = None
        deadline = time.monotonic() + 600
        while True:
            now = time.perf_counter()
            if started is None and any(t.phase is Phase.RESTORING for t in tasks.values()):
                started = now
            if len(tasks) == PARTITIONS and all(t.phase is Phase.LIVE for t in tasks.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the restore did not finish in 600 s")
            await asyncio.sleep(0.002)
        if started is None:  # went from opening to live between two looks: a short restore
            started = now
        elapsed = max(now - started, 1e-3)
        records = sum(t.counts.restored for t in tasks.values())
        versions = 0
        for task in tasks.values():
            ptables = task.state.tables_for("order_status")
            assert ptables is not None
            versions += sum(v["version"] for _, v in ptables.view("order_status").items())
        if versions != n_events:
            raise RuntimeError(f"restored state counts {versions} events, want {n_events}")
        return records, elapsed
    finally:
        await worker.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--orders", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    topic = f"bench-restore-{uuid.uuid4().hex[:8]}"
    app_id = f"bench-restore-{uuid.uuid4().hex[:8]}"
    await produce(args.bootstrap, topic, args.events, args.orders)
    with tempfile.TemporaryDirectory(prefix="streamapp-restore-") as tmp:
        await project(make_app(app_id, args.bootstrap, topic, f"{tmp}/first"), args.events)
        runs: list[tuple[int, float]] = []
        for r in range(args.rounds):
            app = make_app(app_id, args.bootstrap, topic, f"{tmp}/restore-{r}")
            records, elapsed = await restore_once(app, args.events)
            runs.append((records, elapsed))
            print(f"round {r + 1}: {records:,} records in {elapsed:.2f} s", flush=True)
    rates = [records / elapsed for records, elapsed in runs]
    median = statistics.median(rates)
    print(
        f"changelog restore, {PARTITIONS} partitions, {args.orders:,} orders: "
        f"median {median:,.0f} records/s"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "events": args.events,
                    "orders": args.orders,
                    "records": [records for records, _ in runs],
                    "seconds": [round(elapsed, 3) for _, elapsed in runs],
                    "rates": [round(rate, 1) for rate in rates],
                    "median_records_per_s": round(median, 1),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
