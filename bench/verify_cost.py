"""Cost of ``streamapp verify --sample 1000`` on a 1M-key table and of ``?explain=1`` on a
1,000-event stream (issue 32's note). Not a test: nothing asserts a timing.

One embedded worker (``STREAMAPP_BROKER=none``, SQLite event store) of
tests/apps/verify_app.py builds ``totals`` from N streams of 1-2 events each (default 1M
streams), plus one stream of 1,000 events. The script prints, each with the machine's
load (``uptime``) beside it: the time to append the events to the store (``append_many``
in chunks of 20,000 streams), the time the worker took to build the table (until it had
applied every event), the wall time of ``streamapp verify --sample 1000`` (the whole
command: interpreter start, app import, the sample, 1,000 view reads and folds; it must
report 0 differences), and the median of 5 ``GET /tables/totals/KEY?explain=1`` of the
1,000-event stream (the first answer's event count is checked). The store is filled in a
temporary directory, removed afterwards unless ``--keep DIR`` names where to put it.

    .venv/bin/python bench/verify_cost.py [--streams 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamapp import Event  # noqa: E402
from streamapp.eventstore import Append, open_store  # noqa: E402

APP = "tests.apps.verify_app:app"
CHUNK = 20_000
LONG = "long-stream"
LONG_EVENTS = 1_000


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def fill(url: str, streams: int) -> int:
    """N streams of 1-2 events and one of LONG_EVENTS; the number of events appended."""
    rng = random.Random(1)
    store = await open_store(url)
    total = 0
    try:
        for start in range(0, streams, CHUNK):
            batch = []
            for i in range(start, min(start + CHUNK, streams)):
                sid = f"order-{i:07d}"
                events = [Event.create("order.placed", stream_id=sid, data={"n": i})]
                if rng.random() < 0.5:
                    events.append(Event.create("order.paid", stream_id=sid, data={"n": 1}))
                batch.append(Append(sid, events))
                total += len(events)
            result = await store.append_many(batch)
            assert result.error is None, result.error
        long = [Event.create("order.paid", stream_id=LONG, data={"n": 1}) for _ in range(1000)]
        result = await store.append_many([Append(LONG, long)])
        assert result.error is None, result.error
        return total + len(long)
    finally:
        await store.close()


def get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as r:
        return json.loads(r.read())


def applied(port: int) -> int:
    try:
        status = get(port, "/status")
    except OSError:
        return -1
    return sum(p.get("outcomes", {}).get("delivered", 0) for p in status["partitions"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="Keep the store and table in this directory.")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="verify-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{work / 'events.db'}"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMAPP_BROKER="none",
               STREAMAPP_EVENT_STORE=url, ORDERS_NAMESPACE="bench-")  # fmt: skip
    try:
        t0 = time.monotonic()
        n = asyncio.run(fill(url, args.streams))
        print(f"appended {n:,} events of {args.streams + 1:,} streams in "
              f"{time.monotonic() - t0:.1f} s [{uptime()}]", flush=True)  # fmt: skip
        log = (work / "worker.log").open("ab")
        worker = subprocess.Popen(
            [sys.executable, "-m", "streamapp.cli", "worker", "-A", APP, "--data-dir",
             str(work / "data"), "--web-port", str(port)],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            t0 = time.monotonic()
            last, moved = -1, time.monotonic()
            while (done := applied(port)) < n:  # a bench's poll: stops if the worker stalls
                assert worker.poll() is None, "the worker exited: see worker.log"
                if done != last:
                    last, moved = done, time.monotonic()
                assert time.monotonic() - moved < 300, f"the worker stalled at {done:,}"
                time.sleep(1)
            print(f"built the table ({n:,} events applied) in {time.monotonic() - t0:.1f} s "
                  f"[{uptime()}]", flush=True)  # fmt: skip
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-m", "streamapp.cli", "verify", "-A", APP, "totals",
                 "--url", f"http://127.0.0.1:{port}", "--sample", "1000"],
                env=env, cwd=ROOT, capture_output=True, text=True, check=False,
            )  # fmt: skip
            took = time.monotonic() - t0
            assert out.returncode == 0, out.stdout + out.stderr
            print(f"verify --sample 1000: {took:.2f} s wall [{uptime()}]\n  {out.stdout.strip()}")
            times = []
            for _ in range(5):
                t0 = time.monotonic()
                body = get(port, f"/tables/totals/{LONG}?explain=1")
                times.append(time.monotonic() - t0)
                assert len(body["events"]) == LONG_EVENTS, len(body["events"])
            print(f"?explain=1 of a {LONG_EVENTS:,}-event stream: median "
                  f"{statistics.median(times) * 1000:.0f} ms of 5 "
                  f"({', '.join(f'{t * 1000:.0f}' for t in times)} ms) [{uptime()}]")  # fmt: skip
        finally:
            worker.terminate()
            worker.wait(timeout=120)
            log.close()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
