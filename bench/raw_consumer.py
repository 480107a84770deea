"""The raw contender: a plain aiokafka consumer that decodes nothing, the client's ceiling.

Two forms in bench/harness.py: ``raw-default`` (aiokafka's fetch defaults, ``getmany()``
unbounded) and ``raw-tuned`` (``TUNED``: large ``getmany(max_records=...)`` and raised
``max_partition_fetch_bytes`` / ``fetch_max_bytes``). Imports aiokafka only, so its
process's CPU time is the client's. Prints one JSON line:

    .venv/bin/python bench/raw_consumer.py --topic T --events 100000 [--fetch tuned|k=v,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer

MiB = 1024 * 1024

DEFAULTS: dict[str, int] = {}
"""aiokafka 0.14's own: max_partition_fetch_bytes 1 MiB, fetch_max_bytes 50 MiB,
fetch_max_wait_ms 500, getmany(max_records=None)."""

TUNED: dict[str, int] = {
    "max_records": 10_000,
    "max_partition_fetch_bytes": 8 * MiB,
    "fetch_max_bytes": 64 * MiB,
}
"""The best of a quick exploration (``orders_projection.py --explore-fetch``, one run each,
2026-12-02, machine loaded: a hint): 100k standard events, raw 118k ev/s at the defaults,
199k with ``max_records=10000`` alone, 207k with these (span CPU 7.8 -> 4.3 µs/ev); 16 MiB
partition fetches were slower (139k). On 1 KB events no setting beat the defaults
(113k ev/s) beyond noise, and 16 MiB cost more CPU."""

CONSUMER_KEYS = (
    "max_partition_fetch_bytes",
    "fetch_max_bytes",
    "fetch_max_wait_ms",
    "fetch_min_bytes",
    "max_poll_records",
)


def parse_fetch(text: str) -> dict[str, int]:
    """``default``, ``tuned`` or ``key=value,...`` (aiokafka names, ``max_records`` too)."""
    if text in ("", "default"):
        return dict(DEFAULTS)
    if text == "tuned":
        return dict(TUNED)
    out: dict[str, int] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in (*CONSUMER_KEYS, "max_records"):
            raise ValueError(f"unknown fetch setting {key!r}")
        out[key] = int(value)
    return out


def cpu_now() -> float:
    """This process's user + system CPU time so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def consume(
    bootstrap: str, topic: str, n_events: int, fetch: dict[str, int]
) -> dict[str, Any]:
    """Read ``n_events`` with ``fetch``; events/s from the first fetch on (it excluded),
    and the CPU time over that span."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **{k: v for k, v in fetch.items() if k in CONSUMER_KEYS},
    )
    max_records = fetch.get("max_records")
    await consumer.start()
    try:
        seen, first, started, asked, cpu0 = 0, 0, 0.0, 0.0, 0.0
        while seen < n_events:
            asked = time.perf_counter()
            cpu_asked = cpu_now()
            batch = await consumer.getmany(timeout_ms=500, max_records=max_records)
            n = sum(len(recs) for recs in batch.values())
            if n and not seen:
                started, first, cpu0 = time.perf_counter(), n, cpu_now()
            seen += n
        if seen == first:  # a small topic, read in one fetch: time that fetch
            span, events, cpu0 = time.perf_counter() - asked, seen, cpu_asked
        else:
            span, events = time.perf_counter() - started, seen - first
        return {
            "rate": round(events / span, 1),
            "exact": seen >= n_events,
            "note": f"read {seen} records",
            "span_cpu_s": round(cpu_now() - cpu0, 4),
            "span_events": events,
            "fetch": fetch,
        }
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--fetch", default="default", help="default, tuned, or k=v,...")
    args = parser.parse_args()
    out = asyncio.run(consume(args.bootstrap, args.topic, args.events, parse_fetch(args.fetch)))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
