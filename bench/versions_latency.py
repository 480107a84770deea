"""Benchmark: v1's live latency while v2 of its table builds beside it, against v1 alone.

One in-process worker on Kafka (8 partitions) of an orders app whose ``order_status``
replays its history from a SQLite store of N stored events (default 1M over 10,000
orders, filled once and kept in ``bench/.cache``). Two runs on one data directory:

1. **v1 alone**: the worker catches v1 up from the store (timed: v1's replay rate), then
   a publisher in its own process (``bench/latency.py --publish``) sends live events at
   a fixed rate (default 1,000 events/s) for ``--seconds``; each sampled event's latency
   is from its ``send`` to the moment v1's committed store holds it (what the view
   answers from), as ``bench/latency.py`` measures it.
2. **v1 while v2 builds**: the worker restarted with the same agent and a second one
   writing ``order_status`` v2 (another fold) on the same topic: v1 is live at once (its
   checkpoint), v2's lane replays the N stored events. The same publisher runs meanwhile;
   only events sent while v2 is still building count. The building lane's replay rate is
   N over the time from the start until every partition's v2 lane is live.

Live keys (``order-*``) are not the stored ones (``stored-*``). Prints p50 / p99 / max
of both runs, both replay rates and the load average before and after each run;
``--json`` writes them. Not a test: nothing asserts a timing.

    .venv/bin/python bench/versions_latency.py [--events 1000000] [--rate 1000] [--json PATH]
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamapp import App, Event, FromEventStore, Table, TableView  # noqa: E402
from streamapp.engine.phase import Phase  # noqa: E402
from streamapp.eventstore import Append, open_store  # noqa: E402
from streamapp.transports.kafka.topology import create_topics  # noqa: E402
from streamapp.worker import Worker  # noqa: E402

PARTITIONS = 8
ORDERS = 10_000
KINDS = ("placed", "paid", "shipped", "cancelled")
LATENCY = ROOT / "bench" / "latency.py"


def make_app(app_id: str, topic: str, with_v2: bool) -> App:
    """order_status v1 (last status, count); with ``with_v2`` also v2 (count and amounts)."""
    app = App(app_id)
    source = app.topic(topic, partitions=PARTITIONS)
    v1: Table[dict[str, Any]] = Table("order_status")

    @app.agent(source, tables=[v1], history=FromEventStore(), name="status_v1")
    async def status_v1(event: Event, view: TableView[dict[str, Any]]) -> None:
        key = event.stream_id
        assert key is not None
        old = view.get(key)
        view[key] = {"status": event.type, "version": (old["version"] if old else 0) + 1}

    if with_v2:
        v2: Table[dict[str, Any]] = Table("order_status", version=2)

        @app.agent(source, tables=[v2], history=FromEventStore(), name="status_v2")
        async def status_v2(event: Event, view: TableView[dict[str, Any]]) -> None:
            key = event.stream_id
            assert key is not None
            old = view.get(key) or {"version": 0, "amount": 0}
            amount = int((event.data or {}).get("amount", 0))
            view[key] = {"version": old["version"] + 1, "amount": old["amount"] + amount}

    return app


async def fill(url: str, n: int) -> None:
    store = await open_store(url)
    try:
        have = await store.head()
        if have >= n:
            return
        print(f"filling {url} with {n - have:,} events (once)", flush=True)
        for start in range(have, n, 5000):
            events = [
                Event.create(
                    f"order.{KINDS[0 if i < ORDERS else i % 4]}",
                    stream_id=f"stored-{i % ORDERS:05d}",
                    source="bench",
                    data={"amount": i % 997},
                )
                for i in range(start, min(start + 5000, n))
            ]
            result = await store.append_many([Append(e.stream_id or "", [e]) for e in events])
            assert result.error is None, result.error
    finally:
        await store.close()


def v2_building(worker: Worker) -> int:
    """Partitions whose v2 lane is not live yet (its own phase, else its checkpoint)."""
    assert worker.source is not None
    building = 0
    for task in worker.source.assignment.tasks.values():
        for lane in task.lanes:
            if lane.agent.name != "status_v2":
                continue
            phase = getattr(lane, "phase", None)
            if phase is not None:
                building += phase is not Phase.LIVE
            else:
                cp = lane.tables.checkpoint if lane.tables is not None else None
                building += not (cp is not None and cp.caught_up)
    return building


async def run(
    app: App, settings: Any, args: argparse.Namespace, topic: str, while_v2: bool
) -> dict[str, Any]:
    """One worker run: until live (v1), then the publisher; the figures of the run."""
    load_before = os.getloadavg()
    cpu_before = time.process_time()
    await create_topics(app, settings)
    worker = Worker(app, settings)
    started = time.monotonic()
    await worker.start()
    out: dict[str, Any] = {}
    try:
        assert worker.source is not None
        assignment = worker.source.assignment
        while not (
            len(assignment.tasks) == PARTITIONS
            and all(t.phase is Phase.LIVE for t in assignment.tasks.values())
        ):
            if time.monotonic() - started > 1200:
                raise RuntimeError("the worker's partitions did not go live in 20 minutes")
            await asyncio.sleep(0.01)
        live_after = time.monotonic() - started
        if not while_v2:
            out["v1_replay_s"] = round(live_after, 2)
            out["v1_replay_rate"] = round(args.events / live_after)
        seconds = args.seconds if not while_v2 else args.max_seconds
        publisher = await asyncio.create_subprocess_exec(
            sys.executable,
            str(LATENCY),
            "--publish",
            topic,
            "--bootstrap",
            args.bootstrap,
            "--rate",
            str(args.rate),
            "--seconds",
            str(seconds),
            "--orders",
            "1000",
            "--sample",
            str(args.sample),
            stdout=asyncio.subprocess.PIPE,
        )
        pending: dict[str, tuple[int, float]] = {}
        latencies: list[float] = []
        built_at: float | None = None

        async def read() -> None:
            assert publisher.stdout is not None
            async for line in publisher.stdout:
                oid, version, sent = line.decode().split()
                counts = not while_v2 or built_at is None  # sent while v2 builds
                if oid != "achieved" and oid not in pending and counts:
                    pending[oid] = (int(version), float(sent))

        reader = asyncio.create_task(read())
        drained_by: float | None = None  # once the publisher is done: 60 s to drain
        while not reader.done() or pending:
            now = time.monotonic()
            if reader.done():
                drained_by = drained_by or now + 60
                if now > drained_by:
                    raise RuntimeError(f"{len(pending)} sampled events not applied in 60 s")
            if while_v2 and built_at is None and v2_building(worker) == 0:
                built_at = now
                out["v2_replay_s"] = round(now - started, 2)
                out["v2_replay_rate"] = round(args.events / (now - started))
                if publisher.returncode is None:  # enough: what was sent while v2 built
                    publisher.terminate()
            for key, (version, sent) in list(pending.items()):
                _, task = assignment.owner_of("order_status", key)
                ptables = None if task is None else task.state.tables_for("order_status")
                assert ptables is not None, f"{key}: its partition is not served here"
                if ptables.committed_version(key) >= version:
                    latencies.append(now - sent)
                    del pending[key]
            await asyncio.sleep(0.001)
        await publisher.wait()
        if while_v2 and built_at is None:
            out["v2_replay"] = f"v2 still building after {seconds}s of publishing"
    finally:
        await worker.stop()
    latencies.sort()
    if latencies:
        out.update(
            samples=len(latencies),
            p50_ms=round(statistics.median(latencies) * 1000, 2),
            p99_ms=round(latencies[max(0, round(0.99 * len(latencies)) - 1)] * 1000, 2),
            max_ms=round(latencies[-1] * 1000, 2),
        )
    out["cpu_s"] = round(time.process_time() - cpu_before, 1)
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{cache / f'versions-{args.events}.db'}"
    await fill(url, args.events)
    tag = uuid.uuid4().hex[:8]
    topic, app_id = f"bench-versions-{tag}", f"bench-versions-{tag}"
    with tempfile.TemporaryDirectory(prefix="streamapp-versions-") as data_dir:
        figures: dict[str, Any] = {"events": args.events, "rate": args.rate}
        for name, with_v2 in (("v1_alone", False), ("v1_while_v2_builds", True)):
            app = make_app(app_id, topic, with_v2)
            settings = app.settings(
                kafka_bootstrap=args.bootstrap, event_store=url, data_dir=data_dir, web_port=0
            )
            figures[name] = await run(app, settings, args, topic, with_v2)
            print(name, figures[name], flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="stored events")
    parser.add_argument("--rate", type=int, default=1000, help="live events/s published")
    parser.add_argument("--seconds", type=float, default=20.0, help="v1 alone: publishing")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="while v2 builds")
    parser.add_argument("--sample", type=int, default=5, help="measure 1 event in N")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    out = asyncio.run(measure(args))
    a, b = out["v1_alone"], out["v1_while_v2_builds"]
    print(
        f"v1 publish-to-view at {args.rate:,} events/s: alone p50 {a.get('p50_ms')} ms, "
        f"p99 {a.get('p99_ms')} ms; while v2 replays {args.events:,} events p50 "
        f"{b.get('p50_ms')} ms, p99 {b.get('p99_ms')} ms ({b.get('samples')} samples); "
        f"v2 replay {b.get('v2_replay_rate')} events/s, v1 alone {a.get('v1_replay_rate')}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
