"""Benchmark: the order_status projection in streamapp, Quix Streams and faust-streaming,
and a raw aiokafka consumer, on the same broker and the same data, in one run.

Rounds alternate the contenders; the report gives events/s medians and ratios (machines
here are noisy: compare ratios, never a bare time). Not a test: nothing here asserts a
timing. streamapp always commits its changelog in Kafka transactions, so the rivals run
in their exactly-once modes too (``--rival-guarantee`` to change). faust-streaming is
two orders of magnitude slower, so it reads only the first ``--faust-events`` events.

    scripts/bench            # or: .venv/bin/python bench/orders_projection.py --events 100000

``--one streamapp`` is what bench/harness.py runs per streamapp round (one JSON line: the
rate, the CPU time over the timed span, the per-partition commit cycle); ``--fetch``
overrides the live consumer's fetch settings in that process (to try values before they
become streamapp's defaults). ``--explore-fetch`` tries a few fetch settings once each on
the raw consumer and on streamapp, both payloads (a quick exploration, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import child  # noqa: E402  (bench/: one contender run in a child process, with its CPU)
import raw_consumer  # noqa: E402
from rivals import check  # noqa: E402  (bench/: the one per-order check of every contender)

from agents.orders import project_order_status  # noqa: E402
from streamapp import App, Event, EventTypes, Park, TableView  # noqa: E402
from streamapp.codecs import kafka as codec  # noqa: E402
from streamapp.settings.event_loop import run as run_loop  # noqa: E402
from streamapp.transports.kafka.topology import create_topics  # noqa: E402
from streamapp.worker import Worker  # noqa: E402
from tables.orders import order_status  # noqa: E402

PARTITIONS = 8


PAYLOADS = ("standard", "1kb")
"""Event data: ``standard`` {order, amount, currency} (51 bytes of JSON; with the key and
the ``ce_*`` headers about 240 bytes a record), ``1kb`` the same plus 13 order lines
(about 980 bytes of JSON, 1.2 KB a record)."""


def order_data(oid: str, i: int, payload: str) -> dict[str, Any]:
    """The data of the producer's ``i``-th event, for order ``oid``."""
    data: dict[str, Any] = {"order": oid, "amount": i % 997, "currency": "EUR"}
    if payload == "1kb":
        data["lines"] = [
            {"sku": f"SKU-{(i + j) % 999_999:06d}", "name": f"item {j} of the order",
             "qty": 1 + j % 3, "price": 100 * j + 99}
            for j in range(13)
        ]  # fmt: skip
    elif payload != "standard":
        raise ValueError(f"unknown payload {payload!r}; choose from {PAYLOADS}")
    return data


async def produce(
    bootstrap: str, topic: str, n_events: int, n_orders: int, payload: str = "standard"
) -> None:
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
                data=order_data(oid, i, payload),
            )
            key, value, headers = codec.encode(event)
            futures.append(await producer.send(topic, value, key=key, headers=headers))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


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


def cpu_now() -> float:
    """This process's user + system CPU time so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def apply_fetch(fetch: dict[str, int]) -> None:
    """Give streamapp's live-source consumer these aiokafka fetch settings, in this process
    only (``max_records`` becomes ``max_poll_records``, which bounds its ``getmany``)."""
    if not fetch:
        return
    import streamapp.transports.kafka.source as source

    base = source.AIOKafkaConsumer
    given = {("max_poll_records" if k == "max_records" else k): v for k, v in fetch.items()}

    def consumer(*args: Any, **kwargs: Any) -> Any:
        return base(*args, **{**kwargs, **given})

    source.AIOKafkaConsumer = consumer  # type: ignore[misc,assignment]


async def streamapp_worker(
    bootstrap: str, topic: str, n_events: int, n_orders: int, data_dir: str, kind: str
) -> dict[str, Any]:
    """events/s of the reference projection (order_status) in one worker, with its
    transactional changelog, RocksDB writes and offset commits; ``kind``
    ``streamapp-dict`` and ``streamapp-typed`` also read each event's data (dicts, or
    msgspec models). Also the CPU time over the timed span and the commit cycle: the
    median time between two commits of one partition (each settles a batch and makes
    its state visible), polled every 10 ms."""
    app = App(
        f"bench-{uuid.uuid4().hex[:8]}", kafka_bootstrap=bootstrap, data_dir=data_dir, web_port=0
    )
    source = app.topic(topic, partitions=PARTITIONS)
    parked = Park(f"{topic}.parked")
    first: list[tuple[float, float]] = []  # when the first event was handled, and the CPU

    def timed(handler: Any) -> Any:
        """``handler``, noting when it first runs: the span starts at the first event
        handled, as the rivals' (bench/rivals.py ``Clock``), and ends when the last one
        is committed (theirs: handled), so work done before the first commit is in it."""

        @functools.wraps(handler)
        async def run(event: Any, statuses: Any) -> None:
            if not first:
                first.append((time.perf_counter(), cpu_now()))
            await handler(event, statuses)

        return run

    if kind == "streamapp-typed":
        app.agent(
            source, tables=[order_status], on_failure=parked, name="project", events=ORDER_TYPES
        )(timed(project_typed))
    elif kind == "streamapp-dict":
        app.agent(source, tables=[order_status], on_failure=parked, name="project")(
            timed(project_dict)
        )
    else:
        app.agent(source, tables=[order_status], on_failure=parked, name="project")(
            timed(project_order_status.handler)
        )
    settings = app.settings()
    await create_topics(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        last: dict[Any, tuple[int, float]] = {}  # task -> (processed, when it last moved)
        gaps: list[float] = []
        while True:
            assert worker.source is not None
            now, done = time.perf_counter(), 0
            for key, task in worker.source.assignment.tasks.items():
                processed = task.counts.processed
                done += processed
                seen = last.get(key)
                if seen is not None and processed != seen[0]:
                    gaps.append(now - seen[1])
                if processed and (seen is None or processed != seen[0]):
                    last[key] = (processed, now)
            if done >= n_events:
                break
            await asyncio.sleep(0.01)
        assert first
        started, cpu0 = first[0]
        span, span_cpu = time.perf_counter() - started, cpu_now() - cpu0
        figures = commit_figures(worker)
        await check_committed(worker, n_events, n_orders)
        return {
            "rate": round((done - 1) / span, 1),
            "timed_from": "the first event handled, to the last one committed",
            "exact": True,
            "span_cpu_s": round(span_cpu, 4),
            "span_events": done - 1,
            # each partition committed once (a small topic): the span bounds the cycle
            "commit_cycle_s": round(statistics.median(gaps) if gaps else span, 3),
            "commit_cycle_from": f"{len(gaps)} gaps" if gaps else "the timed span",
            **figures,
        }
    finally:
        await worker.stop()


def commit_figures(worker: Worker) -> dict[str, Any]:
    """Commits, mean batch size and mean commit time, from the worker's own metrics."""
    registry = worker.metrics.registry
    labels = {"agent": "project"}

    def sample(name: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    commits = sample("streamapp_commit_duration_seconds_count")
    batches = sample("streamapp_batch_size_count")
    return {
        "commits": int(commits),
        "mean_batch": round(sample("streamapp_batch_size_sum") / batches, 1) if batches else None,
        "mean_commit_ms": (
            round(1000 * sample("streamapp_commit_duration_seconds_sum") / commits, 2)
            if commits
            else None
        ),
    }


def committed_state(worker: Worker) -> dict[str, Any]:
    """order id -> its order_status row, read from every partition's committed table."""
    assert worker.source is not None
    state: dict[str, Any] = {}
    for task in worker.source.assignment.tasks.values():
        tables = task.state.tables_for("order_status")
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


async def one(
    kind: str, bootstrap: str, topic: str, n_events: int, n_orders: int, fetch: dict[str, int]
) -> None:
    """Run streamapp (or raw aiokafka) once over ``topic`` and print one JSON line: the
    harness runs every contender so, each in a fresh process (bench/child.py)."""
    if kind == "raw":
        out = await raw_consumer.consume(bootstrap, topic, n_events, fetch)
    else:
        apply_fetch(fetch)
        with tempfile.TemporaryDirectory(prefix="streamapp-bench-") as data_dir:
            out = await streamapp_worker(bootstrap, topic, n_events, n_orders, data_dir, kind)
        out["fetch"] = fetch
    print(json.dumps(out), flush=True)


def ours(
    kind: str,
    bootstrap: str,
    topic: str,
    events: int,
    orders: int,
    fetch: str = "default",
    timeout_s: float = 300,
) -> child.RunResult:
    """One run of raw aiokafka (bench/raw_consumer.py) or streamapp (``--one``), in a child
    process; streamapp's final state checked per order, as every rival's."""
    if kind == "raw":
        cmd = [sys.executable, str(ROOT / "bench" / "raw_consumer.py"), "--fetch", fetch]
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "orders_projection.py"), "--one", kind]
        cmd += ["--orders", str(orders), "--fetch", fetch]
    cmd += ["--bootstrap", bootstrap, "--topic", topic, "--events", str(events)]
    return child.contender(cmd, timeout_s, events)


def rival(
    name: str,
    bootstrap: str,
    topic: str,
    events: int,
    orders: int,
    flags: Sequence[str] = (),
    timeout_s: float = 900,
    topic_events: int | None = None,
) -> child.RunResult:
    """One rival, run by bench/rivals.py in its own process, over the first ``events`` of
    the topic's ``topic_events``; ``flags`` are rivals.py's (``--exactly-once``,
    ``--recovery``, ``--commit-interval S``)."""
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
    hint = " (is the bench extra installed? pip install -e .[bench])"
    return child.contender(cmd, timeout_s, events, hint)


async def explore_fetch(bootstrap: str, events: int) -> None:
    """A few fetch settings, once each, on the raw consumer and on streamapp, over a fresh
    topic of each payload (1,000 orders): which raise the rate. One run each: a hint."""
    mib = raw_consumer.MiB
    raws = [
        "default",
        "max_records=10000",
        f"max_partition_fetch_bytes={4 * mib}",
        f"max_records=10000,max_partition_fetch_bytes={4 * mib},fetch_max_bytes={64 * mib}",
        f"max_records=10000,max_partition_fetch_bytes={8 * mib},fetch_max_bytes={64 * mib}",
        f"max_records=50000,max_partition_fetch_bytes={16 * mib},fetch_max_bytes={128 * mib}",
    ]
    mine = ["default", f"max_records=2000,max_partition_fetch_bytes={4 * mib}", "tuned"]
    print(f"load average before: {os.getloadavg()}")
    for payload in PAYLOADS:
        topic = f"bench-fetch-{payload}-{uuid.uuid4().hex[:8]}"
        print(f"producing {events:,} {payload} events to {topic}", flush=True)
        await produce(bootstrap, topic, events, 1_000, payload)
        runs = [("raw", f) for f in raws] + [("streamapp", f) for f in mine]
        for kind, fetch in runs:
            r = await asyncio.to_thread(ours, kind, bootstrap, topic, events, 1_000, fetch)
            shown = f"{r.rate:>10,.0f} ev/s" if r.rate is not None else f"n/a ({r.problem})"
            cycle = r.extra.get("commit_cycle_s")
            print(
                f"{payload:<8} {kind:<9} {shown}  cpu {r.cpu_us_per_event} us/ev "
                f"(span {r.span_cpu_us_per_event})  load {r.load_1m}  {fetch}"
                + (f"  commit cycle {cycle} s, batch {r.extra.get('mean_batch')}" if cycle else ""),
                flush=True,
            )
    print(f"load average after: {os.getloadavg()}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--orders", type=int, default=1_000)
    parser.add_argument("--payload", choices=PAYLOADS, default="standard")
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
        choices=("raw", "streamapp", "streamapp-uvloop", "streamapp-dict", "streamapp-typed"),
        help="one run over --topic",
    )
    parser.add_argument("--topic", help="with --one: an existing topic of --events events")
    parser.add_argument(
        "--fetch", default="default", help="with --one: default, tuned or k=v,... (aiokafka's)"
    )
    parser.add_argument(
        "--explore-fetch", action="store_true", help="try a few fetch settings once each"
    )
    args = parser.parse_args()
    if args.one:
        fetch = raw_consumer.parse_fetch(args.fetch)
        await one(args.one, args.bootstrap, args.topic, args.events, args.orders, fetch)
        return
    if args.explore_fetch:
        await explore_fetch(args.bootstrap, args.events)
        return

    topic = f"bench-orders-{uuid.uuid4().hex[:8]}"
    print(f"producing {args.events} order events over {args.orders} orders to {topic} ...")
    await produce(args.bootstrap, topic, args.events, args.orders, args.payload)
    rivals = [r for r in args.rivals.split(",") if r and r != "none"]
    runs: dict[str, list[child.RunResult]] = {}
    for r in range(args.rounds):
        for name, fetch in (("raw-default", "default"), ("raw-tuned", "tuned")):
            run = await asyncio.to_thread(
                ours, "raw", args.bootstrap, topic, args.events, args.orders, fetch
            )
            runs.setdefault(name, []).append(run)
        runs.setdefault("streamapp", []).append(
            await asyncio.to_thread(
                ours, "streamapp", args.bootstrap, topic, args.events, args.orders
            )
        )
        for name in rivals:
            n = min(args.events, args.faust_events) if name == "faust" else args.events
            flags = ["--exactly-once"] if args.rival_guarantee == "exactly-once" else []
            runs.setdefault(name, []).append(
                await asyncio.to_thread(
                    rival, name, args.bootstrap, topic, n, args.orders, flags, 900, args.events
                )
            )
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k} {v[-1].rate or 0:,.0f} ev/s" for k, v in runs.items()),
            flush=True,
        )
    medians = {
        k: statistics.median(x.rate for x in v if x.rate is not None)
        for k, v in runs.items()
        if any(x.rate is not None for x in v)
    }
    cpus = {
        k: statistics.median(c for x in v if (c := x.cpu_us_per_event) is not None)
        for k, v in runs.items()
        if any(x.cpu_us_per_event is not None for x in v)
    }
    ceiling, mine = medians.get("raw-tuned"), medians.get("streamapp")
    print()
    print(f"{'consumer':<12} {'median ev/s':>12} {'/ raw-tuned':>12} {'CPU us/ev':>10}   rounds")
    for name, values in runs.items():
        med = medians.get(name)
        share = f"{med / ceiling:.2f}" if med and ceiling else "n/a"
        print(
            f"{name:<12} {med or 0:>12,.0f} {share:>12} {cpus.get(name, 0):>10.1f}   "
            + " ".join(f"{v.rate or 0:,.0f}" for v in values)
        )
        for v in values:
            if v.problem:
                print(f"{name:<12} warning: {v.problem}")
    if ceiling and mine:
        print(f"streamapp / raw-tuned: {mine / ceiling:.2f}  (rivals: {args.rival_guarantee})")
    print(f"load average now: {os.getloadavg()}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"orders-projection-{stamp}.json").write_text(
        json.dumps(
            {
                "events": args.events,
                "orders": args.orders,
                "payload": args.payload,
                "rounds": {k: [dataclasses.asdict(x) for x in v] for k, v in runs.items()},
                "medians": medians,
                "cpu_us_per_event": cpus,
                "rival_guarantee": args.rival_guarantee,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    # ``--one streamapp-uvloop``: the run's loop is uvloop, as setting event_loop="uvloop"
    # makes ``streamapp worker``'s (streamapp.settings.event_loop)
    run_loop(main(), "uvloop" if "streamapp-uvloop" in sys.argv else "asyncio")
