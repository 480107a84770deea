"""Benchmark: live latency of the orders projection at a fixed rate, publish to view.

A publisher in its own process (as a real publisher is: it does not share the worker's
event loop) sends events at a fixed rate (default 2,000 events/s, over 1,000 orders, each
with its stream version) to a fresh 8-partition topic. For one event in ``--sample``, the
latency is the time from the ``send`` call to the moment its order is seen at that
version. Every process reads ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for the
whole machine). Two measures, one after the other (``--modes``):

- ``http``, what a user sees: a ``streamapp worker`` process of the orders app, asked
  ``GET /tables/order_status/{key}`` over HTTP by this process (another one), each
  sampled key polled every ``--poll-ms`` (2 ms) until it answers that version (at most
  ``--connections`` requests in flight). Beside it: the HTTP round trip of a lookup
  answered at once (the same GET of a key already seen, sampled during the run), the
  probe's requests/s and the worker's CPU per event (``/proc``), and the worker's own
  batch and commit means (its ``/metrics``).
- ``in-process``: the worker in this process, its committed store read directly every
  millisecond, no HTTP (what ``GET /tables/...`` answers from: the committed state,
  never an open batch).

Both send ``--warmup-s`` (3 s) at the rate first, unmeasured: a fresh topic's first
second is a start-up figure (up to 3 s a sample, once). Each measure gives its worst
five samples with when they were sent.

The headline (``p50_ms``, ``p99_ms``) is the ``http`` measure; ``in_process`` holds the
other, with the same fields. Prints both; ``--json`` writes them. Not a test: nothing
asserts a timing.

    .venv/bin/python bench/latency.py [--rate 2000] [--seconds 20] [--warmup-s 3]
                                      [--modes http,in-process] [--poll-ms 2] [--json PATH]
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
from typing import Any

import aiohttp
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
MODES = ("http", "in-process")
WARMUP_S = 3.0
"""Sent before the measured span, unsampled: a fresh topic's first second (new segments
on the broker, the first transactions of new changelog partitions, the JIT) took up to
3 s a sample, once, and would make the p99 of a 20 s run a start-up figure."""


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def measure(
    bootstrap: str, rate: int, seconds: float, orders: int, sample: int, warmup_s: float
) -> dict[str, Any]:
    """The ``in-process`` measure: the worker here, its committed store read directly."""
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
            latencies: list[tuple[float, float]] = []  # (sent at, latency)
            publisher = await start_publisher(
                bootstrap, topic, rate, seconds, orders, sample, warmup_s
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
                        latencies.append((sent, now - sent))
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
    return {
        **figures(latencies, rate, achieved, seconds, warmup_s),
        "batches": int(inside["streamapp_batch_size"][1]),
        "mean_batch_size": round(inside["streamapp_batch_size"][0], 1),
        "mean_batch_ms": round(inside["streamapp_batch_duration_seconds"][0] * 1000, 2),
        "mean_commit_ms": round(inside["streamapp_commit_duration_seconds"][0] * 1000, 2),
    }


async def start_publisher(
    bootstrap: str,
    topic: str,
    rate: int,
    seconds: float,
    orders: int,
    sample: int,
    warmup_s: float,
) -> asyncio.subprocess.Process:
    """The publisher process (:func:`publish`), its stdout piped: the sampled sends."""
    return await asyncio.create_subprocess_exec(
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
        "--warmup-s",
        str(warmup_s),
        stdout=asyncio.subprocess.PIPE,
    )


async def measure_http(
    bootstrap: str,
    rate: int,
    seconds: float,
    orders: int,
    sample: int,
    poll_s: float,
    connections: int,
    warmup_s: float,
) -> dict[str, Any]:
    """The ``http`` measure: a worker process, its view polled over HTTP from here."""
    from tests.integration.harness import WorkerProc, wait_group_ready
    from tests.integration.harness import create_topics as create_namespace

    ns = f"blat{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_namespace(bootstrap, ns)
    with tempfile.TemporaryDirectory(prefix="streamapp-latency-") as tmp:
        worker = WorkerProc(bootstrap, ns, Path(tmp) / "w", Path(tmp) / "w.log").start()
        try:
            await wait_group_ready([worker], PARTITIONS)
            assert worker.proc is not None
            pid = worker.proc.pid
            base = f"http://127.0.0.1:{worker.port}"
            latencies: list[tuple[float, float]] = []  # (sent at, latency)
            round_trips: list[float] = []
            requests = 0
            connector = aiohttp.TCPConnector(limit=connections)
            async with aiohttp.ClientSession(connector=connector) as http:

                async def version_of(key: str) -> int:
                    nonlocal requests
                    requests += 1
                    async with http.get(f"{base}/tables/order_status/{key}") as r:
                        if r.status == 404:
                            await r.read()
                            return 0
                        if r.status != 200:
                            raise RuntimeError(f"{key}: {r.status} {await r.text()}")
                        return int((await r.json())["version"])

                async def poll(key: str, version: int, sent: float) -> None:
                    for _ in range(int(60 / poll_s)):  # at most 60 s per sampled event
                        if await version_of(key) >= version:
                            seen = time.monotonic()
                            latencies.append((sent, seen - sent))
                            began = time.monotonic()  # once seen: a lookup answered at once
                            await version_of(key)
                            round_trips.append(time.monotonic() - began)
                            return
                        await asyncio.sleep(poll_s)
                    raise RuntimeError(f"{key} version {version} not seen in 60 s")

                await version_of("order-00000")  # the connection is up
                publisher = await start_publisher(
                    bootstrap, topic, rate, seconds, orders, sample, warmup_s
                )
                assert publisher.stdout is not None
                polls: list[asyncio.Task[None]] = []
                achieved = 0.0
                # the worker's CPU and the probe's requests over the measured span only:
                # from the first sampled send (the warm-up's are not printed)
                cpu_before, started = 0.0, 0.0
                async for line in publisher.stdout:
                    oid, version, sent = line.split()
                    if oid == b"achieved":
                        achieved = float(sent)
                    else:
                        if not polls:
                            cpu_before, started, requests = cpu_s(pid), time.monotonic(), 0
                        polls.append(
                            asyncio.create_task(poll(oid.decode(), int(version), float(sent)))
                        )
                await asyncio.gather(*polls)
                elapsed = time.monotonic() - started
                cpu_used = cpu_s(pid) - cpu_before
                if await publisher.wait() != 0:
                    raise RuntimeError("the publisher failed")
                async with http.get(f"{base}/metrics") as r:
                    inside = worker_means(await r.text())
        finally:
            worker.stop()
    return {
        **figures(latencies, rate, achieved, seconds, warmup_s),
        "poll_ms": poll_s * 1000,
        "http_rtt_p50_ms": round(percentile(sorted(round_trips), 50) * 1000, 2),
        "http_rtt_p99_ms": round(percentile(sorted(round_trips), 99) * 1000, 2),
        "probe_requests_per_s": round(requests / elapsed),
        "worker_cpu_us_per_event": round(cpu_used / (rate * seconds) * 1e6, 1),
        **inside,
    }


def cpu_s(pid: int) -> float:
    """CPU time (user + system) process ``pid`` used so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_means(text: str) -> dict[str, float | int]:
    """The worker's batch and commit means from its Prometheus text (every agent)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        sums[metric] = sums.get(metric, 0.0) + float(value)

    def mean(name: str) -> tuple[float, float]:
        count = sums.get(f"{name}_count", 0.0)
        return (sums.get(f"{name}_sum", 0.0) / count if count else 0.0), count

    size, batches = mean("streamapp_batch_size")
    return {
        "batches": int(batches),
        "mean_batch_size": round(size, 1),
        "mean_batch_ms": round(mean("streamapp_batch_duration_seconds")[0] * 1000, 2),
        "mean_commit_ms": round(mean("streamapp_commit_duration_seconds")[0] * 1000, 2),
    }


def figures(
    samples: list[tuple[float, float]],
    rate: int,
    achieved: float,
    seconds: float,
    warmup_s: float,
) -> dict[str, Any]:
    """The percentiles of ``samples`` (sent at, latency), and the worst five with when
    they were sent (seconds into the measured span): a stall shows as a run of them."""
    latencies = sorted(latency for _, latency in samples)
    first = min(sent for sent, _ in samples)
    worst = sorted(samples, key=lambda s: -s[1])[:5]
    return {
        "rate": rate,
        "achieved_rate": round(achieved, 1),
        "seconds": seconds,
        "samples": len(latencies),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "warmup_s": warmup_s,
        "worst": [[round(sent - first, 2), round(latency * 1000, 1)] for sent, latency in worst],
    }


def _mean(registry: CollectorRegistry, name: str) -> tuple[float, float]:
    """The mean and count of a histogram of agent ``p`` in the worker's metrics."""
    total = registry.get_sample_value(f"{name}_sum", {"agent": "p"}) or 0.0
    count = registry.get_sample_value(f"{name}_count", {"agent": "p"}) or 0.0
    return (total / count if count else 0.0), count


async def publish(
    bootstrap: str,
    topic: str,
    rate: int,
    seconds: float,
    orders: int,
    sample: int,
    warmup_s: float = 0.0,
) -> None:
    """The publisher process: sends at ``rate`` on a fixed schedule, ``warmup_s`` first
    and then ``seconds``; for one event in ``sample`` past the warm-up prints ``order
    version sent_at`` (monotonic seconds), then ``achieved`` (of the measured span)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0
    )
    await producer.start()
    try:
        warmup = int(rate * warmup_s)
        total = warmup + int(rate * seconds)
        tick = 0.005  # send rate * tick events every 5 ms, on a fixed schedule
        per_tick = max(1, round(rate * tick))
        versions = [0] * orders
        started = measured_from = time.monotonic()
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
            if i == warmup:
                measured_from = sent
            if i >= warmup and i % sample == 0:
                print(oid, versions[n], repr(sent), flush=True)
        achieved = (total - warmup) / (time.monotonic() - measured_from)
        await producer.flush()
        print("achieved 0", achieved, flush=True)
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="events/s published")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=20, help="measure 1 event in N")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S, help="sent first, not measured")
    parser.add_argument("--modes", default=",".join(MODES), help="http, in-process or both")
    parser.add_argument("--poll-ms", type=float, default=2.0, help="http: poll interval")
    parser.add_argument("--connections", type=int, default=4, help="http: requests in flight")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument("--publish", metavar="TOPIC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        asyncio.run(
            publish(
                args.bootstrap,
                args.publish,
                args.rate,
                args.seconds,
                args.orders,
                args.sample,
                args.warmup_s,
            )
        )
        return
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; give {', '.join(MODES)}")
    runs: dict[str, dict[str, Any]] = {}
    for mode in modes:
        if mode == "http":
            runs[mode] = asyncio.run(
                measure_http(
                    args.bootstrap,
                    args.rate,
                    args.seconds,
                    args.orders,
                    args.sample,
                    args.poll_ms / 1000,
                    args.connections,
                    args.warmup_s,
                )
            )
        else:
            runs[mode] = asyncio.run(
                measure(
                    args.bootstrap,
                    args.rate,
                    args.seconds,
                    args.orders,
                    args.sample,
                    args.warmup_s,
                )
            )
        show(mode, runs[mode])
    out = dict(runs.get("http") or runs[modes[0]])
    if "in-process" in runs and "http" in runs:
        out["in_process"] = runs["in-process"]
    out["mode"] = "http" if "http" in runs else modes[0]
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


def show(mode: str, out: dict[str, Any]) -> None:
    """One measure's line."""
    extra = ""
    if mode == "http":
        extra = (
            f"; HTTP round trip p50 {out['http_rtt_p50_ms']} ms p99 {out['http_rtt_p99_ms']} ms,"
            f" polled every {out['poll_ms']:g} ms ({out['probe_requests_per_s']:,} requests/s),"
            f" worker CPU {out['worker_cpu_us_per_event']} us/event"
        )
    print(
        f"{mode}: publish-to-view at {out['rate']:,} events/s (achieved "
        f"{out['achieved_rate']:,.0f}), {out['samples']} samples: p50 {out['p50_ms']} ms, "
        f"p99 {out['p99_ms']} ms, max {out['max_ms']} ms; inside the worker: "
        f"{out['batches']} batches of {out['mean_batch_size']} events, "
        f"{out['mean_batch_ms']} ms to run and {out['mean_commit_ms']} ms to commit on "
        f"average{extra}; worst (s into the run, ms): {out['worst']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
