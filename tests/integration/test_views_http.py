"""A worker's HTTP face on real Kafka: readiness through a restore, metrics that count
what was sent, the bearer token enforced and kept out of logs."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.waits import frozen, until

from .harness import WorkerProc, create_topics, order_events, produce, wait_caught_up

pytestmark = [pytest.mark.integration]


def _value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name}{labels} in:\n{text[:3000]}")


async def test_readyz_503_while_restoring_then_200_and_metrics_count_events(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"views{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, _ = order_events(20_000, 20_000)
    await produce(kafka_bootstrap, topic, events)
    a = WorkerProc(kafka_bootstrap, ns, tmp_path / "a", tmp_path / "a.log").start()
    try:
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, [a])
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{a.port}/metrics") as r,
        ):
            assert r.status == 200
            text = await r.text()
        agent = "project_order_status"
        assert _value(text, "streamapp_events_total", agent=agent, outcome="delivered") == 20_000
        assert _value(text, "streamapp_batch_size_sum", agent=agent) == 20_000
        assert _value(text, "streamapp_commit_duration_seconds_count", agent=agent) >= 8
        assert _value(text, "streamapp_partitions", phase="live") == 8
    finally:
        assert a.stop() == 0

    # A fresh worker (empty data dir) restores every partition from the changelog.
    b = WorkerProc(kafka_bootstrap, ns, tmp_path / "b", tmp_path / "b.log").start()
    try:
        seen: list[tuple[int, dict[str, str]]] = []
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                assert b.alive, b.log_text()[-3000:]
                try:
                    async with http.get(f"http://127.0.0.1:{b.port}/readyz") as r:
                        body = await r.json()
                        seen.append((r.status, body["not_live"]))
                        if r.status == 503:
                            assert r.headers["Retry-After"]
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False  # not serving yet

            await until(  # while it restores, the partitions not live change
                ready,
                what="the restoring worker ready",
                progress=lambda: (len(b.log_text()), frozen(seen[-1:])),
                poll_s=0.01,
            )
            assert seen
            assert seen[-1][0] == 200, seen[-5:]
            assert any(s == 503 and "restoring" in nl.values() for s, nl in seen), seen[:20]
            async with http.get(f"http://127.0.0.1:{b.port}/metrics") as r:
                text = await r.text()
        restored = _value(text, "streamapp_restored_records_total", agent="project_order_status")
        assert restored >= 20_000
        assert _value(text, "streamapp_ready") == 1
    finally:
        if b.alive:
            assert b.stop() == 0


async def test_token_enforced_and_absent_from_logs(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns = f"token{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    token = f"tok-{uuid.uuid4().hex}"
    w = WorkerProc(
        kafka_bootstrap,
        ns,
        tmp_path / "w",
        tmp_path / "w.log",
        extra_env={"STREAMAPP_WEB_TOKEN": token},
    ).start()
    try:
        base = f"http://127.0.0.1:{w.port}"
        good = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                assert w.alive, w.log_text()[-3000:]
                try:
                    async with http.get(f"{base}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await until(
                healthy,
                what="/healthz served",
                progress=lambda: len(w.log_text()),
                poll_s=0.2,
            )
            for path in ("/readyz", "/status", "/metrics", "/tables", "/tables/order_status/x"):
                async with http.get(base + path) as r:
                    assert r.status == 401, path
                    assert (await r.json())["error"]
                async with http.get(base + path, headers={"Authorization": "Bearer no"}) as r:
                    assert r.status == 401, path
                async with http.get(base + path, headers=good) as r:
                    assert r.status != 401, path
    finally:
        assert w.stop() == 0
    log = w.log_text()
    assert "started" in log
    assert token not in log
