"""Event store throughput: batched and single appends, then read_all over everything.

    .venv/bin/python bench/eventstore_bench.py sqlite:////tmp/bench-events.db 1000000
    .venv/bin/python bench/eventstore_bench.py 'postgresql://postgres@127.0.0.1/streamapp' 200000

Use an empty store (a fresh file, or a fresh schema via ``?options=-csearch_path%3D...``).
"""

from __future__ import annotations

import asyncio
import sys
import time

from streamapp.events import Event
from streamapp.eventstore import Append, open_store


async def main(url: str, n: int, batch: int = 2000) -> None:
    store = await open_store(url)
    try:
        appended = 0
        started = time.perf_counter()
        while appended < n:
            size = min(batch, n - appended)
            events = [
                Event.create("bench.tick", stream_id=f"s-{(appended + i) % 10_000}", data={"i": i})
                for i in range(size)
            ]
            result = await store.append_many([Append(e.stream_id or "", [e]) for e in events])
            assert result.error is None, result.error
            appended += size
        took = time.perf_counter() - started
        print(f"append_many ({batch} per transaction): {n / took:,.0f} events/s")
        started = time.perf_counter()
        for i in range(300):
            await store.append(f"single-{i}", [Event.create("t", stream_id=f"single-{i}")], 0)
        print(f"single appends: {300 / (time.perf_counter() - started):,.0f}/s")
        started, position, total = time.perf_counter(), 1, 0
        while rows := await store.read_all(position, 10_000):
            total += len(rows)
            position = rows[-1].position + 1
        took = time.perf_counter() - started
        print(f"read_all: {total:,} events in {took:.2f}s = {total / took:,.0f} events/s")
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
