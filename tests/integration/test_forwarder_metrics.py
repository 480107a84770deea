"""``streamapp forward``'s /metrics and /status on real Kafka and a SQLite store: events
published, lag behind the store head (in events and in seconds), the lock gauge of a
holder and of a forwarder waiting, and consecutive failures while the broker is unreachable."""

from __future__ import annotations

import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.waits import frozen
from tests.support.waits import until as wait_until

from .harness import create_topics
from .test_forwarder import APP, Forwarder, append_at_rate, consume

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def ns(kafka_bootstrap: str) -> str:
    namespace = f"fwm{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, namespace, APP)
    return namespace


async def status(url: str, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(f"{url}/status", headers=headers) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def metrics(url: str, token: str | None = None) -> dict[str, float]:
    """``/metrics`` as ``{name: value}`` (one forwarder: one sample per name)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics", headers=headers) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    found = re.findall(r"^(streamapp_forwarder_\w+)\{[^}]*\} (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


async def until(url: str, want: Any, stalled_s: float, token: str | None = None) -> dict[str, Any]:
    """Polls /status until ``want(body)``; returns that body. Fails once the figures
    (but the rate, which decays by itself) stood still for ``stalled_s``."""
    body: dict[str, Any] = {}

    async def reached() -> dict[str, Any] | None:
        body.clear()
        body.update(await status(url, token))
        return dict(body) if want(body) else None

    reached_body: dict[str, Any] = await wait_until(
        reached,
        what="the forwarder's figures",
        progress=lambda: frozen({k: v for k, v in body.items() if k != "rate"}),
        stalled_s=stalled_s,
        poll_s=0.2,
        detail=lambda: body,
    )
    return reached_body


async def test_published_total_and_lag_behind_the_head(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    await append_at_rate(url, 1500, rate=1e9, chunk=500)
    token = "s3cret-token"
    fwd = Forwarder(
        kafka_bootstrap, ns, url, tmp_path / "fwd.log", env={"STREAMAPP_WEB_TOKEN": token}
    )
    fwd.start("--chunk", "300")
    try:
        web = await fwd.web_url()
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{web}/metrics") as r:
                assert r.status == 401  # the worker's bearer token guards the metrics
            async with s.get(f"{web}/healthz") as r:
                assert r.status == 200
        started = time.monotonic()
        body = await until(web, lambda b: b["published"] == 1500 and b["lag"] == 0, 60, token)
        first = time.monotonic() - started
        assert body["lock_held"] is True
        assert body["checkpoint_position"] == 1501
        assert body["store_head"] == 1500
        assert body["consecutive_failures"] == 0
        assert body["lag_s"] == 0
        await append_at_rate(url, 500, rate=1e9, chunk=500)
        started = time.monotonic()
        await until(web, lambda b: b["published"] == 2000 and b["lag"] == 0, 60, token)
        second = time.monotonic() - started
        got = await metrics(web, token)
        assert got["streamapp_forwarder_published_total"] == 2000
        assert got["streamapp_forwarder_lag_events"] == 0
        assert got["streamapp_forwarder_lag_seconds"] == 0
        assert got["streamapp_forwarder_lock_held"] == 1
        assert got["streamapp_forwarder_checkpoint_position"] == 2001
        assert got["streamapp_forwarder_store_head"] == 2000
        assert got["streamapp_forwarder_consecutive_failures"] == 0
        assert "streamapp_forwarder_rate_events_per_second" in got
        records = await consume(kafka_bootstrap, f"{ns}fwd-orders", 2000)
        assert len(records) == 2000  # what /metrics counted is what reached the topic
        print(f"caught up: 1500 in {first:.1f}s, 500 more in {second:.1f}s")
    finally:
        assert fwd.stop() == 0, fwd.log()[-3000:]


async def test_lock_gauge_on_the_holder_and_on_a_forwarder_waiting(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    await append_at_rate(url, 200, rate=1e9)
    holder = Forwarder(kafka_bootstrap, ns, url, tmp_path / "a.log").start()
    waiting = Forwarder(kafka_bootstrap, ns, url, tmp_path / "b.log")
    try:
        a = await holder.web_url()
        await until(a, lambda b: b["lock_held"] and b["published"] == 200, 60)
        waiting.start()
        b = await waiting.web_url()
        body = await until(b, lambda s: s["store_head"] == 200, 30)
        assert body["lock_held"] is False
        assert body["published"] == 0
        assert (await metrics(b))["streamapp_forwarder_lock_held"] == 0
        assert (await metrics(a))["streamapp_forwarder_lock_held"] == 1
        holder.kill()  # the waiting one takes over
        started = time.monotonic()
        await until(b, lambda s: s["lock_held"], 60)
        print(f"took over in {time.monotonic() - started:.1f}s")
        assert (await metrics(b))["streamapp_forwarder_lock_held"] == 1
    finally:
        if holder.proc is not None and holder.proc.poll() is None:
            holder.stop()
        if waiting.proc is not None:
            assert waiting.stop() == 0, waiting.log()[-3000:]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_consecutive_failures_grow_while_the_broker_is_unreachable(
    ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    await append_at_rate(url, 50, rate=1e9)
    nowhere = f"127.0.0.1:{unused_port()}"  # nothing listens there
    fwd = Forwarder(nowhere, ns, url, tmp_path / "fwd.log").start()
    try:
        web = await fwd.web_url()
        started = time.monotonic()
        first = await until(web, lambda b: b["consecutive_failures"] >= 2, 60)
        later = await until(
            web, lambda b: b["consecutive_failures"] > first["consecutive_failures"], 30
        )
        took = time.monotonic() - started
        assert fwd.proc is not None
        assert fwd.proc.poll() is None
        assert later["published"] == 0
        assert later["lag"] == 50
        assert first["lag_s"] > 0, first  # its first event waits, and waits longer
        assert later["lag_s"] > first["lag_s"], (first, later)
        assert later["lock_held"] is True
        got = await metrics(web)
        assert got["streamapp_forwarder_consecutive_failures"] >= later["consecutive_failures"]
        assert got["streamapp_forwarder_lag_seconds"] > later["lag_s"]
        print(f"{later['consecutive_failures']} failures in {took:.1f}s")
    finally:
        assert fwd.stop() == 0, fwd.log()[-3000:]
