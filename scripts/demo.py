"""Run the reference orders app end to end and print its table views (see scripts/demo).

Orders are appended to the event store; a worker replays them into its tables (catch-up)
and hands over to the live topic, which the forwarder feeds from the same store; then
live orders are appended, and the views show every order exactly once applied.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaProducer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamapp import Event  # noqa: E402
from streamapp.codecs import structured  # noqa: E402

BOOTSTRAP = os.environ["STREAMAPP_KAFKA_BOOTSTRAP"]
NS = os.environ["ORDERS_NAMESPACE"]
PORT = 6066
ORDERS = [f"demo-order-{i}" for i in range(1, 6)]
LIFECYCLES = [
    ["placed", "paid", "shipped"],
    ["placed", "cancelled"],
    ["placed", "paid"],
    ["placed"],
    ["placed", "paid", "shipped"],
]


HISTORY_ORDERS, HISTORY_EVENTS = 2_000, 50_000


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamapp.cli", *args]


def run(*args: str, stdin: Path | None = None) -> None:
    with stdin.open("rb") if stdin else open(os.devnull, "rb") as source:
        subprocess.run(cli(*args), cwd=ROOT, check=True, stdin=source)


def history_file(path: Path) -> None:
    """HISTORY_EVENTS order events as JSON lines (structured CloudEvents, no versions:
    the store assigns them)."""
    statuses = ("paid", "shipped", "cancelled")
    with path.open("wb") as out:
        for i in range(HISTORY_EVENTS):
            oid = f"history-{i % HISTORY_ORDERS:04d}"
            step = "placed" if i < HISTORY_ORDERS else statuses[i % 3]
            event = Event.create(f"order.{step}", stream_id=oid, source="demo", data={"n": i})
            out.write(structured.to_json(event) + b"\n")


def live_file(path: Path) -> int:
    """The demo orders' lifecycles, each event with its stream version."""
    n = 0
    with path.open("wb") as out:
        for oid, steps in zip(ORDERS, LIFECYCLES, strict=True):
            for version, step in enumerate(steps, 1):
                event = Event.create(
                    f"order.{step}",
                    stream_id=oid,
                    source="demo",
                    version=version,
                    data={"order": oid, "amount": 10 * version},
                )
                out.write(structured.to_json(event) + b"\n")
                n += 1
    return n


async def publish_junk() -> None:
    """One record that is not a CloudEvent, straight to the topic: the app parks it."""
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(f"{NS}orders", b"not a cloudevent", key=b"junk")
    finally:
        await producer.stop()


async def status() -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        try:
            async with http.get(f"http://127.0.0.1:{PORT}/status") as r:
                body: dict[str, object] = await r.json()
                return body
        except aiohttp.ClientError:
            return {}


async def watch_catch_up(deadline: float) -> None:
    """Print the partitions' phases until all are live."""
    last = ""
    while time.monotonic() < deadline:
        body = await status()
        parts = body.get("partitions") or {}
        assert isinstance(parts, dict)
        phases = sorted(p["phase"] for p in parts.values())
        line = ", ".join(f"{phases.count(ph)} {ph}" for ph in sorted(set(phases)))
        if line and line != last:
            print(f"   partitions: {line}")
            last = line
        if parts and body.get("ready"):
            return
        await asyncio.sleep(0.2)
    raise SystemExit("demo: the worker did not catch up in time")


async def query_one(oid: str) -> object:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{PORT}/tables/order_status/{oid}") as r,
    ):
        return await r.json()


async def query(deadline: float) -> dict[str, object]:
    rows: dict[str, object] = {}
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            for oid in ORDERS:
                try:
                    async with http.get(f"http://127.0.0.1:{PORT}/tables/order_status/{oid}") as r:
                        if r.status == 200:
                            rows[oid] = await r.json()
                except aiohttp.ClientError:
                    pass
            done = all(
                isinstance(rows.get(o), dict) and rows[o]["version"] == len(s)  # type: ignore[index]
                for o, s in zip(ORDERS, LIFECYCLES, strict=True)
            )
            if done:
                return rows
            await asyncio.sleep(0.5)
    raise SystemExit(f"demo: the view did not show every order in time; got {rows}")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="streamapp-demo-"))
    os.environ["STREAMAPP_EVENT_STORE"] = f"sqlite:///{work / 'events.db'}"
    print(f"== creating topics of app {NS}orders")
    run("topics", "create", "-A", "agents.orders:app")
    print(f"== streamapp store append: {HISTORY_EVENTS} history events of {HISTORY_ORDERS} orders")
    history_file(work / "history.jsonl")
    run("store", "append", "-A", "agents.orders:app", str(work / "history.jsonl"))
    print(f"== starting a worker (data dir {work / 'data'}, views on :{PORT}): it replays")
    args = ["-A", "agents.orders:app", "--data-dir", str(work / "data"), "--web-port", str(PORT)]
    worker = subprocess.Popen(
        cli("worker", *args),
        cwd=ROOT,
    )
    forwarder: subprocess.Popen[bytes] | None = None
    codes = {}
    try:
        asyncio.run(watch_catch_up(time.monotonic() + 120))
        print("== caught up; starting the forwarder (store -> live topic)")
        forwarder = subprocess.Popen(cli("forward", "-A", "agents.orders:app"), cwd=ROOT)
        n = live_file(work / "live.jsonl")
        print(f"== streamapp store append: {n} live events of {len(ORDERS)} demo orders")
        run("store", "append", "-A", "agents.orders:app", str(work / "live.jsonl"))
        asyncio.run(publish_junk())
        print("== published 1 record that is not a CloudEvent straight to the topic")
        rows = asyncio.run(query(time.monotonic() + 60))
        print("== GET /tables/order_status/<order id>")
        for oid, row in rows.items():
            print(f"{oid}: {row}")
        history = asyncio.run(query_one("history-0007"))
        print(f"history-0007: {history}")
        print(f"== GET /status: {asyncio.run(status()).get('history')}")
    finally:
        for name, proc in (("forwarder", forwarder), ("worker", worker)):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                codes[name] = proc.wait(timeout=60)
                print(f"== {name} stopped (exit {codes[name]})")
    if any(codes.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
