"""Run the reference orders app end to end and print its table view (see scripts/demo)."""

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
from streamapp.kafka import codec  # noqa: E402

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


def run(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "streamapp.cli", *args], cwd=ROOT, check=True)


async def publish() -> int:
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", enable_idempotence=True)
    await producer.start()
    n = 0
    try:
        for oid, steps in zip(ORDERS, LIFECYCLES, strict=True):
            for version, step in enumerate(steps, 1):
                event = Event.create(
                    f"order.{step}",
                    stream_id=oid,
                    source="demo",
                    version=version,
                    data={"order": oid, "amount": 10 * version},
                )
                key, value, headers = codec.encode(event)
                await producer.send_and_wait(f"{NS}orders", value, key=key, headers=headers)
                n += 1
        # One record that is not a CloudEvent: the app parks it and goes on.
        await producer.send_and_wait(f"{NS}orders", b"not a cloudevent", key=b"junk")
    finally:
        await producer.stop()
    return n


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
    print(f"== creating topics of app {NS}orders")
    run("topics", "create", "-A", "agents.orders:app")
    data_dir = tempfile.mkdtemp(prefix="streamapp-demo-")
    print(f"== starting a worker (data dir {data_dir}, views on :{PORT})")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamapp.cli",
            "worker",
            "-A",
            "agents.orders:app",
            "--data-dir",
            data_dir,
            "--web-port",
            str(PORT),
        ],
        cwd=ROOT,
    )
    try:
        n = asyncio.run(publish())
        print(f"== published {n} order events and 1 record that is not a CloudEvent")
        rows = asyncio.run(query(time.monotonic() + 60))
        print("== GET /tables/order_status/<order id>")
        for oid, row in rows.items():
            print(f"{oid}: {row}")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        print(f"== worker stopped cleanly (exit {code})")
    if code != 0:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
