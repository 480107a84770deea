"""Benchmark: catch-up replay from the event store into RocksDB tables.

One worker of the orders projection, 8 partitions, replays N stored events (default 1M
over 10,000 orders) from SQLite and from PostgreSQL into its RocksDB tables, on the store
alone (``STREAMAPP_BROKER=none``: no changelog, so the figure is the replay path itself).
The stores are filled once and kept (``bench/.cache`` for SQLite, a schema named after N
for PostgreSQL), since filling takes longer than replaying. The run checks the result
(every order's version equals its event count) and prints events/s, with rounds
alternating per store and the median. Not a test: nothing asserts a timing.

    .venv/bin/python bench/replay.py [--events 1000000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, FromEventStore  # noqa: E402
from streamapp.engine.phase import Phase  # noqa: E402
from streamapp.eventstore import Append, open_store  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8
ORDERS = 10_000
STATUSES = ("placed", "paid", "shipped", "cancelled")


def make_app() -> App:
    app = App("bench-replay")  # a fresh data dir each round: nothing carries over
    topic = app.topic("bench-orders", partitions=PARTITIONS)
    app.agent(topic, tables=[order_status], history=FromEventStore(), name="project")(
        project_order_status.handler
    )
    return app


async def fill(url: str, n: int) -> None:
    store = await open_store(url)
    try:
        have = await store.head()
        if have >= n:
            return
        print(f"filling {url} with {n - have} events (once)", flush=True)
        batch = 5000
        for start in range(have, n, batch):
            events = [
                Event.create(
                    f"order.{STATUSES[0 if i < ORDERS else i % 4]}",
                    stream_id=f"order-{i % ORDERS:05d}",
                    source="bench",
                    data={"n": i},
                )
                for i in range(start, min(start + batch, n))
            ]
            result = await store.append_many([Append(e.stream_id or "", [e]) for e in events])
            assert result.error is None, result.error
    finally:
        await store.close()


CPU_US: dict[str, list[float]] = {}
"""CPU time (user + system, every thread of this process) per replayed event, per store
and round: steadier than the rate on a shared machine."""


async def replay_once(url: str, n: int, data_dir: Path) -> float:
    app = make_app()
    settings = app.settings(
        broker="none", event_store=url, data_dir=data_dir, web_port=0, poll_timeout_ms=100
    )
    worker = Worker(app, settings)
    started, cpu = time.perf_counter(), time.process_time()
    await worker.start()
    try:
        assert worker.source is not None
        tasks = worker.source.assignment.tasks
        for _ in range(600_000):  # polled every 10 ms, at most 100 minutes
            if tasks and all(t.phase is Phase.LIVE for t in tasks.values()):
                break
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - started
        CPU_US.setdefault(url.split(":", 1)[0], []).append((time.process_time() - cpu) / n * 1e6)
        check(tasks, n)
    finally:
        await worker.stop()
    return n / elapsed


def check(tasks: dict[Any, Any], n: int) -> None:
    counted = 0
    for task in tasks.values():
        for _, value in task.tables.views[0].items():
            counted += value["version"]
    assert counted == n, f"replayed {counted} events, want {n}"


async def pg_url(n: int) -> str:
    import psycopg

    base = os.environ.get(
        "STREAMAPP_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/streamapp"
    )
    schema = f"bench_replay_{n}"
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    return f"{base}?options={quote(f'-csearch_path={schema}')}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--profile", action="store_true", help="pyinstrument the last round")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    urls: dict[str, str] = {}
    for kind in args.stores.split(","):
        if kind == "sqlite":
            urls[kind] = f"sqlite:///{cache / f'replay-{args.events}.db'}"
        elif kind == "postgres":
            urls[kind] = await pg_url(args.events)
        await fill(urls[kind], args.events)
    rates: dict[str, list[float]] = {k: [] for k in urls}
    for r in range(args.rounds):
        for kind, url in urls.items():
            data = Path(tempfile.mkdtemp(prefix="replay-"))
            try:
                if args.profile and r == args.rounds - 1:
                    from pyinstrument import Profiler

                    with Profiler(async_mode="enabled") as profiler:
                        rate = await replay_once(url, args.events, data)
                    out = cache / f"replay-{kind}.html"
                    out.write_text(profiler.output_html())
                    print(profiler.output_text(unicode=False, color=False, show_all=False)[:6000])
                else:
                    rate = await replay_once(url, args.events, data)
            finally:
                shutil.rmtree(data, ignore_errors=True)
            rates[kind].append(rate)
            cpu_us = CPU_US[url.split(":", 1)[0]][-1]
            print(f"round {r + 1} {kind}: {rate:,.0f} events/s, {cpu_us:.2f} CPU us/event")
    print(f"\nreplay of {args.events:,} events, {PARTITIONS} partitions, one worker, RocksDB")
    print("| store | median events/s | rounds | median CPU us/event |")
    print("|---|---|---|---|")
    for kind, values in rates.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        cpu_us = statistics.median(CPU_US[urls[kind].split(":", 1)[0]])
        print(f"| {kind} | {statistics.median(values):,.0f} | {shown} | {cpu_us:.2f} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "events": args.events,
                    "orders": ORDERS,
                    "rates": rates,
                    "medians": {k: statistics.median(v) for k, v in rates.items()},
                    "cpu_us_per_event": {
                        k: statistics.median(CPU_US[urls[k].split(":", 1)[0]]) for k in rates
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
