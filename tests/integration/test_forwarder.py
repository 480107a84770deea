"""The forwarder on real Kafka: every store event reaches the topic keyed by stream id,
at least once across ``kill -9``, and only one forwarder of a store publishes at a time."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sqlite3
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from streamapp import Event
from streamapp.eventstore import Append, open_store
from tests.support.waits import until, until_exit

from .harness import ROOT, app_env, create_topics, streamapp_cmd

pytestmark = pytest.mark.integration
APP = "tests.apps.forward_app:app"


@dataclass
class Forwarder:
    """One ``streamapp forward`` process."""

    bootstrap: str
    namespace: str
    store_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self, *extra: str) -> Forwarder:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                streamapp_cmd(
                    "forward", "-A", APP, "--poll-interval", "0.2", "--web-port", "0", *extra
                ),
                env=app_env(
                    self.bootstrap, self.namespace, STREAMAPP_EVENT_STORE=self.store_url, **self.env
                ),
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
        """SIGTERM; until it exits, failing with its log's tail once it neither exited nor
        logged for a minute (it logs its stop)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return until_exit(
            self.proc,
            what="forwarder exited",
            progress=lambda: len(self.log()),
            detail=lambda: self.log()[-3000:],
        )

    async def web_url(self, stalled_s: float = 30) -> str:
        """Where this forwarder serves /metrics and /status (``--web-port 0``: from its log)."""
        await self.wait_log("/status on http://", stalled_s)
        found = re.search(r"/status on (http://[\d.]+:\d+)", self.log())
        assert found, self.log()[-3000:]
        return found.group(1)

    async def wait_log(self, text: str, stalled_s: float = 30) -> None:
        """Until the log has ``text``; fails once the log did not grow for ``stalled_s``."""

        def logged() -> bool:
            if text in self.log():
                return True
            assert self.proc is not None
            assert self.proc.poll() is None, f"forwarder exited:\n{self.log()[-3000:]}"
            return False

        await until(
            logged,
            what=f"{text!r} logged",
            progress=lambda: len(self.log()),
            stalled_s=stalled_s,
            detail=lambda: self.log()[-3000:],
        )


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


async def wait_checkpoint(db: Path, name: str, want: int, stalled_s: float = 30) -> None:
    """Until forwarder ``name``'s checkpoint is ``want`` (polled every 0.2 s); fails once
    it stood still for ``stalled_s`` (past ``want`` too: it never comes back)."""
    await until(
        lambda: checkpoint(db, name) == want,
        what=f"forwarder {name}'s checkpoint at {want}",
        progress=lambda: checkpoint(db, name),
        stalled_s=stalled_s,
        poll_s=0.2,
    )


async def wait_checkpoint_past(db: Path, name: str, at_least: int, stalled_s: float = 30) -> int:
    """Until forwarder ``name``'s checkpoint is at least ``at_least``; returns it. Fails
    once it stood still for ``stalled_s``."""
    at: int = await until(
        lambda: (c := checkpoint(db, name)) >= at_least and c,
        what=f"forwarder {name}'s checkpoint at {at_least} or past",
        progress=lambda: checkpoint(db, name),
        stalled_s=stalled_s,
        poll_s=0.05,
    )
    return at


async def consume(bootstrap: str, topic: str, want: int, stalled_s: float = 30) -> list[object]:
    """Records of ``topic`` until ``want`` distinct ce_id values were seen; fails once no
    record came for ``stalled_s``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[object] = []
    ids: set[bytes] = set()

    async def enough() -> bool:
        batch = await consumer.getmany(timeout_ms=500)
        for recs in batch.values():
            for rec in recs:
                records.append(rec)
                ids.add(dict(rec.headers)["ce_id"])
        return len(ids) >= want

    try:
        await until(
            enough,
            what=f"{want} distinct events on {topic}",
            progress=lambda: len(records),
            stalled_s=stalled_s,
            poll_s=0,
        )
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
        await wait_checkpoint(db, f"{ns}fwd", n + 1)
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
        # mid-run, observed: a few chunks published, the load still being appended
        await wait_checkpoint_past(db, f"{ns}fwd", 1000)
        assert not appending.done(), "the load ended before the kill"
        first.kill()
        at_kill = checkpoint(db, f"{ns}fwd")
        assert 1000 <= at_kill < n + 1, f"checkpoint {at_kill}: kill not mid-run"
        second = Forwarder(kafka_bootstrap, ns, url, log).start("--chunk", "200")
        await appending
        await wait_checkpoint(db, f"{ns}fwd", n + 1)
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
        # A publishes chunk after chunk of the running load (observed) while B waits
        await wait_checkpoint_past(db, f"{ns}fwd", 1000)
        assert not appending.done(), "the load ended before the kill"
        assert "published positions" in a.log(), a.log()[-2000:]  # its first chunk's line
        assert "published positions" not in b.log(), "two forwarders published at once"
        assert "holds the forwarder lock" not in b.log()
        a.kill()
        await b.wait_log("holds the forwarder lock")
        await appending
        await wait_checkpoint(db, f"{ns}fwd", n + 1)
        assert b.stop() == 0
    finally:
        if appending is not None:
            appending.cancel()
        for f in (a, b):
            if f.proc is not None and f.proc.poll() is None:
                f.kill()
    # A logs what it checkpointed (a summary every few seconds): B starts past it, from
    # A's checkpoint; every event arriving (below) shows there is no gap.
    a_last = max(int(m) for m in re.findall(r"positions \d+\.\.(\d+)", a.log()))
    found = re.search(r"starts at store position (\d+)", b.log())
    assert found is not None, b.log()
    assert a_last + 1 <= int(found.group(1))
    await consume(kafka_bootstrap, f"{ns}fwd-orders", n)


SUMMARY = re.compile(
    r"published positions \d+\.\.\d+: (\d+) events in [\d.]+s \((\d+) ev/s\), (\d+) in all; "
    r"store position (\d+) of head (\d+), lag (\d+) events"
)


@pytest.mark.slow
async def test_the_forwarder_logs_a_summary_every_few_seconds_not_a_line_per_chunk(
    kafka_bootstrap: str,
    ns: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """60 chunks of 100 over ~3 s: a first-chunk line, a summary a second (the interval
    shortened for the test) with rate, position, head and lag, one stop line; the
    per-chunk offsets only at DEBUG."""
    from streamapp.catchup import forwarder
    from streamapp.codecs import kafka as codec
    from streamapp.transports.kafka.sink import KafkaSink

    monkeypatch.setattr(forwarder, "SUMMARY_EVERY_S", 1.0, raising=False)
    url = f"sqlite:///{tmp_path / 'events.db'}"
    n = 6000
    await append_at_rate(url, 100, rate=1e9)
    store = await open_store(url)
    fwd = forwarder.Forwarder(
        store,
        lambda: KafkaSink(kafka_bootstrap, timeout_s=10),
        [f"{ns}fwd-orders"],
        name=f"{ns}fwd",
        encode=codec.encode,
        chunk=100,
        poll_interval_s=0.1,
    )
    with caplog.at_level(logging.INFO, logger="streamapp.forwarder"):
        running = asyncio.create_task(fwd.run())
        try:
            await append_at_rate(url, n - 100, rate=2000)

            def summarised_all() -> bool:  # the summary that covers the last chunk
                return any(
                    (m := SUMMARY.search(r.getMessage())) and int(m.group(3)) == n
                    for r in caplog.records
                )

            await until(
                summarised_all,
                what=f"a summary at position {n}",
                progress=lambda: (fwd.forwarded, len(caplog.records)),
            )
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await store.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    summaries = [m for line in lines if (m := SUMMARY.search(line))]
    assert len(summaries) >= 2, lines
    assert len(lines) <= len(summaries) + 4, lines  # lock, start, first chunk, stop
    assert not [line for line in lines if "offsets" in line]
    assert sum(int(m.group(1)) for m in summaries) == n - 100  # all but the first chunk
    assert [int(m.group(3)) for m in summaries][-1] == n
    last = summaries[-1]
    assert (int(last.group(4)), int(last.group(5)), int(last.group(6))) == (n, n, 0)
    assert any(int(m.group(2)) > 0 for m in summaries)
    assert f"forwarder {ns}fwd stopped publishing at store position {n + 1}" in lines[-1]
    assert f"({n} events published while it held the lock)" in lines[-1]
