"""Views forward to the owner: 3 workers, 8 partitions, 1,000 keys, every key asked of
every worker answers the owner's value (the token goes along)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import until

from .harness import (
    WorkerProc,
    create_topics,
    partitions_of,
    produce,
    wait_caught_up,
    wait_group_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_every_key_from_every_worker_is_the_owners_value(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"fwd{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    out = create_topics(kafka_bootstrap, ns)
    assert f"{ns}orders-members\t1 partitions\tmembers\tcreated" in out
    keys = [f"order-{i:04d}" for i in range(1000)]
    statuses = ("placed", "paid", "shipped")
    events = [Event.create(f"order.{statuses[i % 3]}", stream_id=k, data={}) for i, k in
              enumerate(keys)]  # fmt: skip
    await produce(kafka_bootstrap, topic, events)
    token = f"tok-{uuid.uuid4().hex}"
    workers = [
        WorkerProc(
            kafka_bootstrap,
            ns,
            tmp_path / n,
            tmp_path / f"{n}.log",
            extra_env={"STREAMAPP_WEB_TOKEN": token},
        ).start()
        for n in ("a", "b", "c")
    ]
    try:
        await wait_group_ready(workers, 8)
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, workers)
        expected = {k: statuses[i % 3] for i, k in enumerate(keys)}
        sem = asyncio.Semaphore(48)
        counts = {"forwarded": 0, "local": 0, "retried": 0}
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:

            async def ask(w: WorkerProc, key: str) -> None:
                url = f"http://127.0.0.1:{w.port}/tables/order_status/{key}?meta=1"

                async def answered() -> bool:
                    async with http.get(url) as r:
                        body: Any = await r.json()
                        if r.status == 503:  # a rebalance: retried while partitions move
                            assert r.headers["Retry-After"]
                            counts["retried"] += 1
                            return False
                        assert r.status == 200, (w.port, key, r.status, body)
                        assert body["value"]["status"] == expected[key], (key, body)
                        fwd = "X-Streamapp-Forwarded-To" in r.headers
                        counts["forwarded" if fwd else "local"] += 1
                        return True

                async def progress() -> bytes:
                    return partitions_of([await w.status()])

                async with sem:
                    await until(
                        answered,
                        what=f"{key} from {w.port} answered, not 503",
                        progress=progress,
                        poll_s=0.2,
                    )

            await asyncio.gather(*(ask(w, k) for w in workers for k in keys))
            assert counts["local"] == 1000, counts  # each key served once by its owner
            assert counts["forwarded"] == 2000, counts
            assert counts["retried"] == 0, counts  # a settled group: no 503 at all

            # A scan asked of any worker is the whole table, merged across the workers.
            for w in workers:
                seen: dict[str, str] = {}
                partitions: set[int] = set()
                cursor = ""
                for _ in range(200):  # bounded: 1,000 keys in pages of 97
                    url = f"http://127.0.0.1:{w.port}/tables/order_status"
                    params = {"limit": "97", "cursor": cursor}
                    async with http.get(url, params=params) as r:
                        page: Any = await r.json()
                        assert r.status == 200, (w.port, page)
                    for item in page["items"]:
                        assert item["key"] not in seen, item  # each key once
                        seen[item["key"]] = item["value"]["status"]
                    partitions.update(page["partitions"])
                    cursor = page["cursor"] or ""
                    if not cursor:
                        break
                assert seen == expected, w.port
                assert partitions == set(range(8))

            # One worker leaves: the others take its partitions, views follow the group.
            assert workers[2].stop() == 0
            await wait_group_ready(workers[:2], 8)
            counts.update(forwarded=0, local=0)
            await asyncio.gather(*(ask(w, k) for w in workers[:2] for k in keys))
            assert counts["local"] == 1000, counts
            assert counts["forwarded"] == 1000, counts
    finally:
        for w in workers:
            if w.alive:
                assert w.stop() == 0
    for w in workers:
        assert token not in w.log_text()
