"""Soak: is a worker's memory flat under a steady load? Not a test: nothing asserts.

``kafka`` (default): the orders app (8 partitions, its order_status table) runs as a
worker process on real Kafka while this harness produces at a fixed rate over fixed keys
for ``--minutes``, sampling the worker's RSS and open file descriptors (``/proc``) and
its RocksDB memory (``/metrics``) every ``--sample-s``. At the end it checks that every
key's table value counts exactly the events produced for it, and reports the RSS slope
(least squares: bytes per event and MB per minute) during and after the warm-up.

``store``: the same write pattern straight into ``--partitions`` RocksStores in this
process, as fast as it goes, with RocksDB's memtable and block-cache sizes summed over
the stores; ``--distinct`` writes a new key per event (the 10-million-key check:
``store --partitions 1 --events 10000000 --distinct``). Reports peak RSS against the
bound (setting ``memory_limit_mb``).

    .venv/bin/python bench/soak.py [kafka] [--minutes 10] [--rate 1000] [--keys 20000]
    .venv/bin/python bench/soak.py store [--events 2000000] [--partitions 8] [--distinct]

Results go to ``bench/results/<date>-soak.json``. Kafka at ``STREAMAPP_KAFKA_BOOTSTRAP``.
The machines here are shared: give the load (``uptime``) with any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamapp import Event  # noqa: E402
from streamapp.codecs import kafka as codec  # noqa: E402

KINDS = ("order.placed", "order.paid", "order.shipped", "order.cancelled")


# -- measuring ------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS)."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (None: fewer than 3 points)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if not sxx:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def slopes(samples: list[dict[str, Any]], warmup_s: float, count: str) -> dict[str, Any]:
    """RSS slopes in bytes per event (over ``count``) and MB per minute, during and
    after the warm-up."""
    out: dict[str, Any] = {}
    for name, part in (
        ("warmup", [s for s in samples if s["t"] < warmup_s]),
        ("after_warmup", [s for s in samples if s["t"] >= warmup_s]),
    ):
        per_event = slope([s[count] for s in part], [s["rss"] for s in part])
        per_s = slope([s["t"] for s in part], [s["rss"] for s in part])
        out[name] = {
            "samples": len(part),
            "bytes_per_event": None if per_event is None else round(per_event, 2),
            "mb_per_min": None if per_s is None else round(per_s * 60 / 2**20, 3),
            "rss_mb": [round(part[0]["rss"] / 2**20, 1), round(part[-1]["rss"] / 2**20, 1)]
            if part
            else None,
        }
    return out


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def write_result(kind: str, result: dict[str, Any]) -> Path:
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y-%m-%d-%H%M%S')}-{kind}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def order_event(i: int, keys: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """Event ``i`` of the soak: key ``i % keys``, its stream version ``i // keys + 1``."""
    oid = f"order-{i % keys:07d}"
    event = Event.create(
        KINDS[(i // keys) % 4],
        stream_id=oid,
        version=i // keys + 1,
        source="soak",
        data={"order": oid, "amount": i % 997, "currency": "EUR"},
    )
    return codec.encode(event)


# -- kafka: a worker process under a fixed rate ----------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def metric_sums(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Sums of the worker's Prometheus samples by name (labels merged) and RocksDB's
    memory by part."""
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("streamapp_rocksdb_memory_bytes"):
            part = name.split('part="')[1].split('"')[0]
            out[f"rocksdb_{part}"] = float(value)
        else:
            base_name = name.split("{")[0]
            out[base_name] = out.get(base_name, 0.0) + float(value)
    return out


def soak_kafka(args: argparse.Namespace) -> dict[str, Any]:
    """Start the worker process, drive it for ``--minutes``, stop it."""
    ns = f"soak{uuid.uuid4().hex[:6]}-"
    work = Path(tempfile.mkdtemp(prefix="streamapp-soak-"))
    port = free_port()
    env = dict(os.environ, ORDERS_NAMESPACE=ns, PYTHONPATH=str(ROOT))
    env["STREAMAPP_KAFKA_BOOTSTRAP"] = args.bootstrap
    env["STREAMAPP_EVENT_STORE"] = f"sqlite:///{work}/events.db"  # empty: no catch-up
    if args.memory_limit_mb:
        env["STREAMAPP_MEMORY_LIMIT_MB"] = str(args.memory_limit_mb)
    cli = [sys.executable, "-m", "streamapp", "-A", "agents.orders:app"]
    subprocess.run([*cli, "topics", "create"], env=env, cwd=ROOT, check=True)
    log = (work / "worker.log").open("wb")
    worker = subprocess.Popen(
        [*cli, "worker", "--data-dir", str(work / "data"), "--web-port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        result = asyncio.run(drive(args, worker, f"http://127.0.0.1:{port}", f"{ns}orders"))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
    result["store_bytes_on_disk"] = sum(
        f.stat().st_size for f in (work / "data").rglob("*") if f.is_file()
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


async def drive(
    args: argparse.Namespace, worker: subprocess.Popen[Any], base: str, topic: str
) -> dict[str, Any]:
    """Produce at ``--rate`` for ``--minutes``, sampling the worker; then check the table."""
    from aiokafka import AIOKafkaProducer

    samples: list[dict[str, Any]] = []
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base, worker)
            await producer.start()
            produced = 0
            started = time.monotonic()
            end = started + args.minutes * 60
            next_sample = started
            tick = 0.1
            total = int(args.minutes * 60 * args.rate)
            while produced < total:
                now = time.monotonic()
                due = total if now >= end else min(int((now - started) * args.rate), total)
                futures = []
                for i in range(produced, due):
                    key, value, headers = order_event(i, args.keys)
                    futures.append(await producer.send(topic, value, key=key, headers=headers))
                produced = due
                if futures:
                    await asyncio.gather(*futures)
                if now >= next_sample:
                    samples.append(await sample(http, base, worker.pid, now - started, produced))
                    s = samples[-1]
                    print(
                        f"t={s['t']:6.0f}s produced={produced:>9,} consumed={s['consumed']:>9,.0f}"
                        f" rss={s['rss'] / 2**20:6.1f} MB fds={s['fds']}"
                        f" rocksdb cache={s.get('rocksdb_cache', 0) / 2**20:.1f} MB"
                        f" load={s['load']}",
                        flush=True,
                    )
                    next_sample += args.sample_s
                await asyncio.sleep(max(0.0, tick - (time.monotonic() - now)))
            await producer.stop()
            exact = await check_exact(http, base, produced, args.keys)
            final = await sample(http, base, worker.pid, time.monotonic() - started, produced)
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
    return {
        "mode": "kafka",
        "label": args.label,
        "minutes": args.minutes,
        "rate": args.rate,
        "keys": args.keys,
        "events": produced,
        "memory_limit_mb": args.memory_limit_mb or "default",
        "warmup_s": args.warmup_s,
        "exact": exact,
        "final": final,
        "fds": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
        "slopes": slopes(samples, args.warmup_s, "consumed"),
        "samples": samples,
    }


async def wait_ready(http: aiohttp.ClientSession, base: str, worker: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"worker exited with {worker.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{base}/readyz") as resp:
                if resp.status == 200 and (await resp.json())["partitions"]:
                    return
        await asyncio.sleep(0.5)
    raise SystemExit("worker not ready after 120 s")


async def sample(
    http: aiohttp.ClientSession, base: str, pid: int, t: float, produced: int
) -> dict[str, Any]:
    metrics = await metric_sums(http, base)
    return {
        "t": round(t, 1),
        "produced": produced,
        "consumed": metrics.get("streamapp_consumed_total", 0.0),
        "rss": rss_bytes(pid),
        "fds": open_fds(pid),
        "load": load(),
        **{k: v for k, v in metrics.items() if k.startswith("rocksdb_")},
    }


async def check_exact(
    http: aiohttp.ClientSession, base: str, produced: int, keys: int
) -> dict[str, Any]:
    """Wait until the worker consumed everything, then read every key's row: its
    ``version`` must be the number of events produced for it."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (await metric_sums(http, base)).get("streamapp_consumed_total", 0) >= produced:
            break
        await asyncio.sleep(1)
    await asyncio.sleep(2)  # the last batch's commit
    wrong: list[str] = []
    sem = asyncio.Semaphore(16)

    async def one(k: int) -> None:
        expected = produced // keys + (1 if k < produced % keys else 0)
        oid = f"order-{k:07d}"
        async with sem, http.get(f"{base}/tables/order_status/{oid}") as resp:
            got = (await resp.json())["version"] if resp.status == 200 else None
        if got != expected:
            wrong.append(f"{oid}: {got} != {expected}")

    await asyncio.gather(*(one(k) for k in range(min(keys, produced))))
    return {"ok": not wrong, "keys_checked": min(keys, produced), "wrong": wrong[:20]}


# -- store: RocksStores in this process ------------------------------------------------
def soak_store(args: argparse.Namespace) -> dict[str, Any]:
    from streamapp.tables.store import RocksStore

    memory: Any = None
    if args.memory_limit_mb:
        from streamapp.tables.rocksdb.cache import rocks_memory

        memory = rocks_memory(args.memory_limit_mb)
    work = Path(tempfile.mkdtemp(prefix="streamapp-soak-store-"))
    kwargs = {"memory": memory} if memory is not None else {}
    stores = [
        RocksStore(work / str(p), ["order_status", "versions", "checkpoint"], **kwargs)
        for p in range(args.partitions)
    ]
    pid = os.getpid()
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    batch = args.batch
    keys = args.events if args.distinct else args.keys
    for first in range(0, args.events, batch):
        per_store: list[dict[str, dict[bytes, bytes | None]]] = [
            {"order_status": {}, "versions": {}, "checkpoint": {}} for _ in stores
        ]
        for i in range(first, min(first + batch, args.events)):
            k = i % keys
            oid = f"order-{k:08d}".encode()
            changes = per_store[k % len(stores)]
            changes["order_status"][oid] = orjson.dumps(
                {"status": KINDS[(i // keys) % 4][6:], "version": i // keys + 1, "last": i}
            )
            changes["versions"][oid] = (i // keys + 1).to_bytes(8, "big")
        for store, changes in zip(stores, per_store, strict=True):
            changes["checkpoint"][b"position"] = str(first + batch).encode()
            store.write(changes)
        done = min(first + batch, args.events)
        if done % args.sample_every < batch or done == args.events:
            families = [f for s in stores for f in (s._db, *s._cfs.values())]
            memtables = sum(
                int(f.property_int_value("rocksdb.cur-size-all-mem-tables")) for f in families
            )  # per column family (the DB's own is the default family's)
            caches = {
                int(f.property_int_value("rocksdb.block-cache-usage")) for f in families
            }  # one value when the cache is shared
            samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "events": done,
                    "rss": rss_bytes(pid),
                    "fds": open_fds(pid),
                    "memtables": memtables,
                    "block_cache": sorted(caches),
                    "load": load(),
                }
            )
            s = samples[-1]
            print(
                f"events={done:>10,} rss={s['rss'] / 2**20:7.1f} MB "
                f"memtables={memtables / 2**20:7.1f} MB block cache(s)="
                f"{[round(c / 2**20, 1) for c in s['block_cache']]} MB fds={s['fds']} "
                f"load={s['load']}",
                flush=True,
            )
    for store in stores:
        store.close()
    disk = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    shutil.rmtree(work, ignore_errors=True)
    limit = args.memory_limit_mb
    return {
        "mode": "store",
        "label": args.label,
        "partitions": args.partitions,
        "events": args.events,
        "keys": keys,
        "distinct": args.distinct,
        "memory_limit_mb": limit or "default of RocksStore",
        "peak_rss_mb": round(max(s["rss"] for s in samples) / 2**20, 1),
        "peak_memtables_mb": round(max(s["memtables"] for s in samples) / 2**20, 1),
        "store_bytes_on_disk": disk,
        "seconds": round(time.monotonic() - started, 1),
        "slopes": slopes(samples, samples[len(samples) // 5]["t"] if samples else 0, "events"),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("kafka", "store"), default="kafka")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000, help="events/s (kafka)")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--events", type=int, default=2_000_000, help="(store)")
    parser.add_argument("--partitions", type=int, default=8, help="stores (store)")
    parser.add_argument("--batch", type=int, default=2000, help="events per write (store)")
    parser.add_argument("--sample-every", type=int, default=100_000, help="events (store)")
    parser.add_argument("--distinct", action="store_true", help="a new key per event (store)")
    parser.add_argument(
        "--memory-limit-mb", type=int, default=0, help="setting memory_limit_mb (0: default)"
    )
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    print(f"load before: {load()}", flush=True)
    result = soak_kafka(args) if args.mode == "kafka" else soak_store(args)
    result["load_after"] = load()
    path = write_result("soak" if args.mode == "kafka" else "soak-store", result)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    print(f"written to {path}")


if __name__ == "__main__":
    main()
