"""Views while a worker joins: 2 workers own 8 partitions with 1,000 orders projected, a
third joins (rebalance, restore from changelogs) under a load of at least 5,000 lookups
spread over all three workers. Every answer is the exact fold (200) or 503 + Retry-After:
never a wrong or stale value, never another status. Meanwhile other orders keep arriving
(a disjoint set of keys), so partitions move while they are being processed."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import until

from .harness import (
    STATUSES,
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    partitions_of,
    produce,
    read_table,
    wait_caught_up,
    wait_group_ready,
)

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]

MIN_REQUESTS = 5_000
AFTER_JOIN_REQUESTS = 1_000  # the load goes on this long once the new worker is live
MAX_REQUESTS = 60_000
JOIN_STALLED_S = 60.0
"""The load stops early when the joining worker's log and /status stood still this long
(it is not getting any closer to owning live partitions); else at MAX_REQUESTS."""
CONCURRENCY = 16
KEYS_PER_ROUND = 3


def late_orders(n_orders: int, n_events: int) -> tuple[list[Event], dict[str, tuple[int, str]]]:
    """Events of orders ``late-*`` (disjoint from ``order-*``), expected (count, status)."""
    events: list[Event] = []
    expected: dict[str, tuple[int, str]] = {}
    for i in range(n_events):
        oid = f"late-{i % n_orders:04d}"
        count = expected.get(oid, (0, ""))[0] + 1
        status = "placed" if count == 1 else STATUSES[1 + i % 3]
        expected[oid] = (count, status)
        events.append(Event.create(f"order.{status}", stream_id=oid, data={"n": i}))
    return events, expected


async def wait_answers(w: WorkerProc, stalled_s: float = 60.0) -> None:
    """Until the worker answers /status; fails once its log did not grow for ``stalled_s``."""

    async def answers() -> bool:
        assert w.alive, f"worker died:\n{w.log_text()[-3000:]}"
        return await w.status() is not None

    await until(
        answers,
        what=f"worker on port {w.port} answering",
        progress=lambda: len(w.log_text()),
        stalled_s=stalled_s,
        poll_s=0.2,
        detail=lambda: w.log_text()[-3000:],
    )


async def test_lookups_stay_exact_while_a_worker_joins(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"vjoin{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(1000, 4000)
    await produce(kafka_bootstrap, topic, events)
    late_events, late_expected = late_orders(200, 3000)
    token = f"tok-{uuid.uuid4().hex}"

    def worker(name: str) -> WorkerProc:
        return WorkerProc(
            kafka_bootstrap,
            ns,
            tmp_path / name,
            tmp_path / f"{name}.log",
            extra_env={"STREAMAPP_WEB_TOKEN": token},
        )

    a, b, c = worker("a"), worker("b"), worker("c")
    workers = [a.start()]
    try:
        # b starts once a answers: a has made the shared SQLite event store by then (two
        # processes making a new store at once may find it locked).
        await wait_answers(a)
        workers.append(b.start())
        await wait_group_ready(workers, 8)
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, workers)

        keys = sorted(expected)
        targets = [a, b]  # c joins the targets once its HTTP answers
        counts: dict[str, int] = {"requests": 0, "ok": 0, "503": 0, "forwarded": 0}
        forwarded_to: dict[str, int] = {}
        per_worker = {w.port: 0 for w in (a, b, c)}
        wrong: list[Any] = []
        joined: dict[str, float] = {}  # when c was started / answered / owned live partitions
        c_url = f"http://127.0.0.1:{c.port}"
        stop = asyncio.Event()
        loaded = asyncio.Event()  # the load runs a while before the join
        started = time.monotonic()

        async def lookup(http: aiohttp.ClientSession, w: WorkerProc, key: str) -> None:
            url = f"http://127.0.0.1:{w.port}/tables/order_status/{key}"
            async with http.get(url) as r:
                body = await r.read()
                counts["requests"] += 1
                if counts["requests"] >= 500:
                    loaded.set()
                per_worker[w.port] += 1
                fwd = r.headers.get("X-Streamapp-Forwarded-To")
                if fwd:
                    counts["forwarded"] += 1
                    forwarded_to[fwd] = forwarded_to.get(fwd, 0) + 1
                if r.status == 503 and r.headers.get("Retry-After"):
                    counts["503"] += 1
                    return
                if r.status != 200:
                    wrong.append((w.port, key, r.status, dict(r.headers), body[:300]))
                    return
                value = await r.json()
                if (value["version"], value["status"]) != expected[key]:
                    wrong.append((w.port, key, 200, expected[key], value, fwd))
                    return
                counts["ok"] += 1

        async def client(http: aiohttp.ClientSession, n: int) -> None:
            rounds = itertools.count(n)
            while not stop.is_set():
                i = next(rounds) * KEYS_PER_ROUND
                batch = [keys[(i + j * 331) % len(keys)] for j in range(KEYS_PER_ROUND)]
                ws = list(targets)
                await asyncio.gather(
                    *(lookup(http, ws[(i + j) % len(ws)], k) for j, k in enumerate(batch))
                )

        async def join_and_watch() -> None:
            await loaded.wait()
            joined["started"] = time.monotonic()
            workers.append(c.start())
            seen: set[object] = set()
            moved = time.monotonic()
            while not stop.is_set():
                assert c.alive, f"c died:\n{c.log_text()[-3000:]}"
                status = await c.status()
                observed = (c.log_size(), partitions_of([status]))
                if observed not in seen:
                    seen.add(observed)
                    moved = time.monotonic()
                if status is not None and "answers" not in joined:
                    joined["answers"] = time.monotonic()
                    targets.append(c)
                if status and status["partitions"] and status["ready"] and "live" not in joined:
                    joined["live"] = time.monotonic()
                    joined["at_request"] = counts["requests"]
                    joined["c_partitions"] = len(status["partitions"])
                done = counts["requests"] >= MIN_REQUESTS and (
                    "live" in joined
                    and counts["requests"] - joined["at_request"] >= AFTER_JOIN_REQUESTS
                )
                if done or counts["requests"] >= MAX_REQUESTS:
                    break
                if time.monotonic() - moved > JOIN_STALLED_S:
                    break  # c stands still: the assertions below say what it missed
                await asyncio.sleep(0.2)
            stop.set()

        async def more_orders() -> None:
            await produce(kafka_bootstrap, topic, late_events, rate=300)

        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=20),
            connector=aiohttp.TCPConnector(limit=CONCURRENCY * KEYS_PER_ROUND),
        ) as http:
            producing = asyncio.create_task(more_orders())
            await asyncio.gather(
                join_and_watch(), *(client(http, n * 97) for n in range(CONCURRENCY))
            )
            await producing
        elapsed = time.monotonic() - started
        summary = {**counts, "per_worker": per_worker, "forwarded_to": forwarded_to,
                   "joined": {k: round(v - started, 2) if k in ("started", "answers", "live")
                              else v for k, v in joined.items()},
                   "elapsed_s": round(elapsed, 1)}  # fmt: skip
        print(summary)

        assert not wrong, f"{len(wrong)} wrong answers, e.g. {wrong[:5]}; {summary}"
        assert counts["requests"] >= MIN_REQUESTS, summary
        assert counts["ok"] + counts["503"] == counts["requests"], summary
        assert "live" in joined, f"c never owned live partitions during the load: {summary}"
        assert joined["c_partitions"] >= 1, summary
        assert counts["forwarded"] > 0, summary
        assert forwarded_to.get(c_url, 0) > 0, f"nothing forwarded to the new worker: {summary}"
        assert all(n > 0 for n in per_worker.values()), summary
        assert counts["ok"] > counts["requests"] // 2, summary  # mostly answered, not 503s

        # Settled: all three own the 8 partitions; both sets of orders are exact.
        await wait_group_ready(workers, 8)
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, workers)
        assert_exact(await read_table(workers, "order_status", keys), expected)
        late = await read_table(workers, "order_status", sorted(late_expected))
        assert_exact(late, late_expected)
    finally:
        for w in workers:
            if w.alive:
                assert w.stop() == 0
    for w in workers:
        assert token not in w.log_text()
