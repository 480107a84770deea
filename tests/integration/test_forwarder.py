"""The forwarder on real Kafka: every store event reaches the topic keyed by stream id,
at least once across ``kill -9``, and only one forwarder of a store publishes at a time."""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from streamapp import Event
from streamapp.eventstore import Append, open_store

from .harness import ROOT, app_env, create_topics, streamapp_cmd

pytestmark = pytest.mark.integration
APP = "tests.integration.forward_app:app"


@dataclass
class Forwarder:
    """One ``streamapp forward`` process."""

    bootstrap: str
    namespace: str
    store_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> Forwarder:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                streamapp_cmd("forward", "-A", APP, "--poll-interval", "0.2", *extra),
                env=app_env(self.bootstrap, self.namespace, STREAMAPP_EVENT_STORE=self.store_url),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    async def wait_log(self, text: str, within_s: float = 30) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if text in self.log():
                return
            assert self.proc is not None
            assert self.proc.poll() is None, f"forwarder exited:\n{self.log()[-3000:]}"
            await asyncio.sleep(0.1)
        raise AssertionError(f"{text!r} not logged within {within_s}s:\n{self.log()[-3000:]}")


def events(n: int, start: int = 0) -> list[Append]:
    return [
        Append(f"order-{i % 97}", [Event.create("order.placed", stream_id=f"order-{i % 97}")])
        for i in range(start, start + n)
    ]


async def append_at_rate(url: str, n: int, rate: float, chunk: int = 100) -> None:
    store = await open_store(url)
    try:
        started = time.monotonic()
        for done in range(0, n, chunk):
            result = await store.append_many(events(min(chunk, n - done), done))
            assert result.error is None
            ahead = (done + chunk) / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        await store.close()


def checkpoint(db: Path, name: str) -> int:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT next_position FROM streamapp_forwarder_checkpoints WHERE name = ?", (name,)
        ).fetchone()
    return 1 if row is None else int(row[0])


async def wait_checkpoint(db: Path, name: str, want: int, within_s: float) -> None:
    """Until forwarder ``name``'s checkpoint is ``want`` (polled every 0.2 s)."""
    for _ in range(int(within_s / 0.2)):
        if checkpoint(db, name) == want:
            return
        await asyncio.sleep(0.2)
    assert checkpoint(db, name) == want


async def consume(bootstrap: str, topic: str, want: int, within_s: float = 60) -> list[object]:
    """Records of ``topic`` until ``want`` distinct ce_id values were seen."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[object] = []
    ids: set[bytes] = set()
    try:
        deadline = time.monotonic() + within_s
        while len(ids) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                for rec in recs:
                    records.append(rec)
                    ids.add(dict(rec.headers)["ce_id"])
    finally:
        await consumer.stop()
    assert len(ids) == want, f"{len(ids)} distinct events on {topic}, want {want}"
    return records


@pytest.fixture
def ns(kafka_bootstrap: str) -> str:
    namespace = f"fwd{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, namespace, APP)
    return namespace


async def test_forwards_every_event_keyed_by_stream_id(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    n = 2000
    await append_at_rate(url, n, rate=1e9, chunk=500)
    fwd = Forwarder(kafka_bootstrap, ns, url, tmp_path / "fwd.log").start("--chunk", "300")
    try:
        records = await consume(kafka_bootstrap, f"{ns}fwd-orders", n)
        await wait_checkpoint(db, f"{ns}fwd", n + 1, within_s=30)
    finally:
        assert fwd.stop() == 0, fwd.log()[-3000:]
    assert len(records) == n  # no crash: each once
    for rec in records:
        headers = dict(rec.headers)  # type: ignore[attr-defined]
        assert rec.key == headers["ce_streamid"]  # type: ignore[attr-defined]
        assert headers["ce_type"] == b"order.placed"
        assert int(headers["ce_streamversion"]) >= 1
        assert headers["content-type"] == b"application/json"
    versions: dict[bytes, list[int]] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):  # type: ignore[attr-defined]
        headers = dict(rec.headers)  # type: ignore[attr-defined]
        versions.setdefault(headers["ce_streamid"], []).append(int(headers["ce_streamversion"]))
    assert all(v == list(range(1, len(v) + 1)) for v in versions.values())  # store order
    with sqlite3.connect(db) as conn:
        offsets = conn.execute(
            "SELECT topic, kafka_offset, position FROM streamapp_forwarder_marks"
        ).fetchall()
    assert offsets
    assert max(pos for _, _, pos in offsets) == n
    # Marks say where live delivery can start after a replay up to a position.
    from streamapp.eventstore import open_store

    store = await open_store(url)
    try:
        ends: dict[int, int] = {}
        for rec in records:
            ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)  # type: ignore[attr-defined]
        for p, end in ends.items():
            assert await store.live_offset(f"{ns}fwd-orders", p, n + 1) == end  # all replayed
            assert await store.live_offset(f"{ns}fwd-orders", p, 1) is None  # nothing replayed
    finally:
        await store.close()
    assert "published positions" in fwd.log()


async def test_kill_9_mid_run_then_restart_loses_nothing(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    n = 20_000
    # the store exists before the forwarder starts
    await append_at_rate(url, 100, rate=1e9)
    appending = asyncio.create_task(append_at_rate(url, n - 100, rate=4000))
    log = tmp_path / "fwd.log"
    first = Forwarder(kafka_bootstrap, ns, url, log).start("--chunk", "200")
    try:
        await first.wait_log("published positions")
        await asyncio.sleep(1.5)
        first.kill()
        at_kill = checkpoint(db, f"{ns}fwd")
        assert 1 < at_kill < n + 1, f"checkpoint {at_kill}: kill not mid-run"
        second = Forwarder(kafka_bootstrap, ns, url, log).start("--chunk", "200")
        await asyncio.wait_for(appending, 60)
        await wait_checkpoint(db, f"{ns}fwd", n + 1, within_s=60)
        assert second.stop() == 0
    finally:
        appending.cancel()
        for f in (first, second if "second" in locals() else None):
            if f is not None and f.proc is not None and f.proc.poll() is None:
                f.kill()
    records = await consume(kafka_bootstrap, f"{ns}fwd-orders", n)
    assert len(records) >= n
    assert f"starts at store position {at_kill}" in log.read_text()


async def test_two_forwarders_one_publishes_the_other_takes_over(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    n = 8000
    await append_at_rate(url, 100, rate=1e9)
    a = Forwarder(kafka_bootstrap, ns, url, tmp_path / "a.log").start("--chunk", "100")
    b = Forwarder(kafka_bootstrap, ns, url, tmp_path / "b.log")
    appending: asyncio.Task[None] | None = None
    try:
        await a.wait_log("holds the forwarder lock")
        b.start("--chunk", "100")
        assert a.proc is not None
        await b.wait_log(f"is held by forwarder {ns}fwd pid {a.proc.pid}")
        # the load starts once both run (a slow start must not let a publish it all)
        appending = asyncio.create_task(append_at_rate(url, n - 100, rate=2000))
        await a.wait_log("published positions")
        await asyncio.sleep(1.0)
        assert "published positions" not in b.log(), "two forwarders published at once"
        assert "holds the forwarder lock" not in b.log()
        assert not appending.done(), "the load ended before the kill"
        a.kill()
        killed_at = time.monotonic()
        await b.wait_log("holds the forwarder lock", within_s=10)
        took_over_s = time.monotonic() - killed_at
        assert took_over_s < 5, f"takeover took {took_over_s:.1f}s"
        await asyncio.wait_for(appending, 60)
        await wait_checkpoint(db, f"{ns}fwd", n + 1, within_s=60)
        assert b.stop() == 0
    finally:
        if appending is not None:
            appending.cancel()
        for f in (a, b):
            if f.proc is not None and f.proc.poll() is None:
                f.kill()
    a_last = max(int(m) for m in re.findall(r"positions \d+\.\.(\d+)", a.log()))
    b_first = min(int(m) for m in re.findall(r"positions (\d+)\.\.", b.log()))
    assert b_first <= a_last + 1  # took over from A's checkpoint: no gap
    await consume(kafka_bootstrap, f"{ns}fwd-orders", n)
