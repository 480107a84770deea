"""Taking over partitions: state restored from changelogs, other partitions not stalled."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from streamapp.topics import partition_for
from tests.support.waits import until

from .harness import (
    WorkerProc,
    alive,
    assert_exact,
    create_topics,
    partitions_of,
    produce,
    read_table,
    wait_caught_up,
    wait_ready,
)

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]

BIG_KEYS = 300_000


def _keys_on(partitions: set[int], n: int, prefix: str) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if partition_for(key.encode(), 8) in partitions:
            out.append(key)
        i += 1
    return out


async def test_restore_of_a_big_partition_does_not_stall_the_others(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"restore{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    # One partition with a table large enough that its restore (~550,000 records/s since
    # the restore reads committed batches itself) lasts long enough to watch the others.
    big = _keys_on({0}, BIG_KEYS, "big-")
    small = _keys_on({1, 2, 3, 4, 5, 6, 7}, 200, "small-")
    first = [Event.create("order.placed", stream_id=k, data={}) for k in big + small]
    await produce(kafka_bootstrap, topic, first)
    a = WorkerProc(kafka_bootstrap, ns, tmp_path / "a", tmp_path / "a.log").start()
    await wait_ready(a)
    await wait_caught_up(kafka_bootstrap, topic, topic, 120, [a])
    assert a.stop() == 0

    # New events wait on the small partitions; a fresh worker (empty data dir) takes all.
    second = [Event.create("order.paid", stream_id=k, data={}) for k in small]
    await produce(kafka_bootstrap, topic, second)
    b = WorkerProc(kafka_bootstrap, ns, tmp_path / "b", tmp_path / "b.log").start()
    try:
        processed_while_restoring = False
        views_during_restore: list[int] = []
        probe = big[123]
        seen: list[dict[str, Any] | None] = [None]
        async with aiohttp.ClientSession() as http:

            async def restored() -> bool:
                nonlocal processed_while_restoring
                alive([b])
                seen[0] = status = await b.status()
                parts = (status or {}).get("partitions", {})
                p0 = parts.get(f"{topic}[0]")
                if p0 and p0["phase"] == "restoring":
                    others = sum(p["processed"] for n, p in parts.items() if not n.endswith("[0]"))
                    processed_while_restoring |= others > 0
                    async with http.get(
                        f"http://127.0.0.1:{b.port}/tables/order_status/{probe}"
                    ) as r:
                        views_during_restore.append(r.status)
                        if r.status == 200:  # it became ready meanwhile: the value is right
                            assert (await r.json())["version"] == 1
                        else:
                            assert r.status == 503
                            assert r.headers["Retry-After"]
                return bool(p0 and p0["phase"] == "live" and status and status["ready"])

            await until(
                restored,
                what=f"{topic}[0] restored and live on the fresh worker",
                progress=lambda: (b.log_size(), partitions_of(seen)),
                poll_s=0.02,
                detail=lambda: f"{seen[0]}\n{b.log_text()[-3000:]}",
            )
        assert processed_while_restoring, b.log_text()[-3000:]
        assert 503 in views_during_restore
        await wait_caught_up(kafka_bootstrap, topic, topic, 60, [b])
        status = await wait_ready(b)
        assert status["partitions"][f"{topic}[0]"]["restored"] >= BIG_KEYS
        keys = big[:500] + small
        table = await read_table([b], "order_status", keys)
        expected = {k: (1, "placed") for k in big[:500]} | {k: (2, "paid") for k in small}
        assert_exact(table, expected)
        assert "restoring " in b.log_text()
    finally:
        if b.alive:
            assert b.stop() == 0


async def test_a_store_older_than_delete_retention_is_wiped_and_restored_in_full(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The Kafka Streams rule: compaction may have dropped deletes a stale store never saw.
    It applies only when the changelog moved on: an idle store at the changelog's end
    is kept (a rebalance that hands it back costs no restore)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from .harness import order_events

    ns = f"stale{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=100, n_events=2_000)
    await produce(kafka_bootstrap, topic, events[:1000])
    first = WorkerProc(kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w.log").start()
    await wait_ready(first)
    await wait_caught_up(kafka_bootstrap, topic, topic, 60, [first])
    assert first.stop() == 0
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # the local store is now older than the changelog's delete retention
        changelog = f"{ns}orders-project_order_status-changelog"
        resource = ConfigResource(
            ConfigResourceType.TOPIC, changelog, {"delete.retention.ms": "1000"}
        )
        await admin.alter_configs([resource])
    finally:
        await admin.close()
    await asyncio.sleep(1.5)
    idle = WorkerProc(kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w2.log").start()
    try:  # old, but nothing happened since: kept as it is
        status = await wait_ready(idle)
        assert sum(p["restored"] for p in status["partitions"].values()) == 0
        assert "wiped and restored in full" not in idle.log_text()
    finally:
        assert idle.stop() == 0

    await produce(kafka_bootstrap, topic, events[1000:])  # applied by another worker
    other = WorkerProc(kafka_bootstrap, ns, tmp_path / "o", tmp_path / "w3.log").start()
    await wait_ready(other)
    await wait_caught_up(kafka_bootstrap, topic, topic, 60, [other])
    assert other.stop() == 0
    await asyncio.sleep(1.5)
    again = WorkerProc(kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w4.log").start()
    try:
        status = await wait_ready(again)
        restored = sum(p["restored"] for p in status["partitions"].values())
        assert restored > 0  # in full, from offset 0: the store is old and behind
        assert again.log_text().count("wiped and restored in full") >= 1
        table = await read_table([again], "order_status", list(expected))
        assert_exact(table, expected)
    finally:
        again.kill()
