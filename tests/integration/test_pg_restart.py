"""A PostgreSQL restart under load: every process recovers by itself, exactly.

The server of the test session is taken down for a few seconds (``scripts/services down
postgres`` then ``up``, or its container stopped and started: tests/support/services.py)
while appends, the forwarder, a Kafka worker's catch-up and a RabbitMQ partition move use
the PostgreSQL event store. No process is restarted; each case converges exactly (every
event once in the store, every position forwarded, tables equal to the fold of the
events) and reports how long it took after the server's return. The append whose COMMIT
reply is lost is cut through a proxy instead (no restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from conftest import PgUrlFactory, Services

from streamapp import Event
from streamapp.codecs.structured import to_json
from streamapp.engine.delivery import STORE_POSITION_HEADER
from streamapp.eventstore import Append, open_store
from streamapp.eventstore.postgres.store import PostgresEventStore
from tests.support.services import restart
from tests.support.waits import Stalled, until

from .harness import (
    ROOT,
    Proxy,
    StreamappProc,
    WorkerProc,
    append_to_store,
    assert_exact,
    create_topics,
    order_events,
    read_table,
    streamapp_cmd,
    topic_size,
    wait_group_ready,
    wait_ready,
    worker_progress,
)
from .test_rabbitmq import rabbit_env, topics_create
from .test_rabbitmq_group import _drained, _read_exact

# serial: it takes a shared service down, freezes a process or skews a clock (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]
DOWN_S = 3.0
FWD_APP = "tests.apps.forward_app:app"


@dataclass
class Outage:
    """Takes the session's PostgreSQL down and up again; always leaves it up."""

    services: Services
    down_at: float = 0.0
    up_at: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    _down: bool = False

    async def restart(self, down_s: float = DOWN_S) -> None:
        await self.down()
        await asyncio.sleep(down_s)  # the outage itself, not a synchronisation
        await self.up()

    async def down(self) -> None:
        """Take the server down (however the session's services were started)."""
        self._down = True
        await asyncio.to_thread(restart, self.services, "down", "postgres")
        self.down_at = time.monotonic()

    async def up(self) -> None:
        """Start the server again; ``up_at`` is when it was called (the server
        answers somewhere within it: times measured from there are upper bounds)."""
        if self._down:
            self.up_at = time.monotonic()
            await asyncio.to_thread(restart, self.services, "up", "postgres")
            self._down = False
            print(f"starting postgres again took {time.monotonic() - self.up_at:.2f}s")

    def since_up(self, name: str) -> float:
        """Seconds from the server's start to now, recorded as figure ``name``."""
        self.figures[name] = time.monotonic() - self.up_at
        print(f"{name}: {self.figures[name]:.2f}s after PostgreSQL was started again")
        return self.figures[name]


@pytest.fixture
async def pg(services: Services, pg_url_factory: PgUrlFactory) -> AsyncIterator[tuple[str, Outage]]:
    """A fresh schema on the session's PostgreSQL, and the outage that restarts it."""
    outage = Outage(services)
    async with pg_url_factory() as url:
        try:
            yield url, outage
        finally:
            await outage.up()


def _sid(i: int, prefix: str, streams: int) -> str:
    return f"{prefix}-{i % streams:04d}"


def _order(i: int, prefix: str, streams: int) -> Event:
    sid = _sid(i, prefix, streams)
    return Event.create("order.placed", stream_id=sid, source="tests", data={"n": i})


async def _all_events(url: str) -> list[Any]:
    store = await open_store(url)
    try:
        return await store.read_all(1, 10_000_000)
    finally:
        await store.close()


def _dense(rows: list[Any]) -> dict[str, int]:
    """Each stream's event count, checking versions are 1..n and no event id repeats."""
    versions: dict[str, list[int]] = {}
    ids = [r.event().id for r in rows]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} events stored twice"
    for r in rows:
        versions.setdefault(r.stream_id, []).append(r.version)
    for sid, vs in versions.items():
        assert vs == list(range(1, len(vs) + 1)), f"stream {sid}: versions {vs[:20]}..."
    return {sid: len(vs) for sid, vs in versions.items()}


# --- (a) appends --------------------------------------------------------------------------


async def test_appends_ride_out_a_restart(pg: tuple[str, Outage], tmp_path: Path) -> None:
    """`streamapp store append` and four API appenders (with expected versions) run through
    a restart: every event is stored once, no appender fails or restarts."""
    url, outage = pg
    cli = await asyncio.create_subprocess_exec(
        *streamapp_cmd("store", "append", "-A", FWD_APP, "-"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "STREAMAPP_EVENT_STORE": url},
    )
    assert cli.stdin is not None
    stop = asyncio.Event()
    lines_written = 0
    api_done: dict[int, dict[str, int]] = {}
    successes: list[list[float]] = []
    stores: list[PostgresEventStore] = []

    async def feed_cli() -> None:
        nonlocal lines_written
        assert cli.stdin is not None
        while not stop.is_set():
            chunk = [_order(lines_written + i, "cli", 50) for i in range(2000)]
            cli.stdin.write(b"".join(to_json(e) + b"\n" for e in chunk))
            await cli.stdin.drain()
            lines_written += len(chunk)
            await asyncio.sleep(0.2)
        cli.stdin.close()

    async def api(k: int) -> None:
        store = await PostgresEventStore.open(url)
        stores.append(store)
        counts: dict[str, int] = {}
        times: list[float] = []
        api_done[k] = counts
        successes.append(times)
        n = 0
        try:
            while not stop.is_set():
                batch = []
                for _ in range(20):
                    sid = _sid(n, f"api{k}", 40)
                    batch.append(Append(sid, [_order(n, f"api{k}", 40)], counts.get(sid, 0)))
                    counts[sid] = counts.get(sid, 0) + 1
                    n += 1
                result = await store.append_many(batch)
                assert result.error is None, result.error
                times.append(time.monotonic())
                await asyncio.sleep(0.01)
        finally:
            await store.close()

    feeders = [asyncio.create_task(feed_cli()), *(asyncio.create_task(api(k)) for k in range(4))]
    try:
        while lines_written < 6000 or sum(len(t) for t in successes) < 100:
            assert not any(f.done() for f in feeders), [f.exception() for f in feeders if f.done()]
            await asyncio.sleep(0.1)
        await outage.restart()
        # every API appender appends again (synchronised on its own successes)

        def appending() -> tuple[int, int]:  # the appenders' successes, the CLI's lines
            assert not any(f.done() for f in feeders), [f.exception() for f in feeders if f.done()]
            return sum(len(t) for t in successes), lines_written

        await until(
            lambda: all(t and t[-1] > outage.up_at for t in successes),
            what="every API appender appending again",
            progress=appending,
            poll_s=0.05,
        )
        resumed = max(next(x for x in t if x > outage.up_at) for t in successes) - outage.up_at
        outage.figures["api appends resumed"] = resumed
        print(f"api appends resumed {resumed:.2f}s after PostgreSQL was started again")
        written_before = lines_written
        await until(  # the CLI's pipe flows again
            lambda: lines_written >= written_before + 4000,
            what="the CLI appender appending again",
            progress=lambda: lines_written,
            poll_s=0.05,
        )
        stop.set()
        await asyncio.gather(*feeders)
        out, err = await asyncio.wait_for(cli.communicate(), 120)
    finally:
        stop.set()
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
    assert cli.returncode == 0, err.decode()[-3000:]
    assert f"appended {lines_written} events" in out.decode(), out.decode()
    assert "connection lost" in err.decode(), err.decode()[-3000:]  # the fault hit the CLI
    assert all(s.session.reconnects >= 1 for s in stores)  # ... and every API appender
    rows = await _all_events(url)
    counts = _dense(rows)
    assert sum(v for k, v in counts.items() if k.startswith("cli-")) == lines_written
    for k, done in api_done.items():
        got = {sid: n for sid, n in counts.items() if sid.startswith(f"api{k}-")}
        assert got == done
    assert [r.position for r in rows] == list(range(1, len(rows) + 1))


async def test_an_append_whose_commit_reply_is_lost_is_not_applied_twice(
    services: Services, pg_url_factory: PgUrlFactory
) -> None:
    """The connection dies after the server committed, before the client heard it: the
    retry finds the rows it sent and returns their result (no expected version, so a
    blind retry would store the events twice)."""
    port = int(services.postgres.rsplit(":", 1)[1].split("/")[0])
    proxy = Proxy("127.0.0.1", port)
    proxy_port = await proxy.start()
    async with pg_url_factory() as url:
        via = url.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{proxy_port}/")
        assert via != url
        store = await PostgresEventStore.open(via)
        try:
            first = await store.append("s-0000", [_order(0, "s", 1)])
            armed = [True]

            async def lose_the_commit_reply() -> None:
                if armed.pop() if armed else False:
                    proxy.cut_at_reply()

            store.before_commit = lose_the_commit_reply
            events = [_order(i, "s", 1) for i in range(1, 4)]
            result = await store.append("s-0000", events)
        finally:
            await store.close()
            await proxy.stop()
        assert proxy.replies_dropped == 1
        assert store.session.reconnects == 1
        assert (first.version, result.version) == (1, 4)
        rows = await _all_events(url)
        assert len(rows) == 4, f"{len(rows)} events stored, want 4"
        assert [r.event().id for r in rows[1:]] == [e.id for e in events]
        assert result.position == rows[-1].position


# --- (b) forwarding -----------------------------------------------------------------------

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _held(log: str) -> list[tuple[datetime, datetime | None]]:
    """The intervals a forwarder may publish in: from its start at the checkpoint (logged
    once it holds the lock) to its "lost the forwarder lock" (logged once it stopped)."""
    out: list[tuple[datetime, datetime | None]] = []
    for line in log.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if " starts at store position " in line:
            assert not out or out[-1][1] is not None, f"started twice: {line}"
            out.append((at, None))
        elif "lost the forwarder lock" in line:
            assert out, f"lost a lock it never held: {line}"
            assert out[-1][1] is None, f"lost a lock it did not hold: {line}"
            out[-1] = (out[-1][0], at)
    return out


def _published_at(log: str) -> list[datetime]:
    return [
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        for line in log.splitlines()
        if "published positions" in line and (m := _STAMP.match(line))
    ]


async def _positions(bootstrap: str, topic: str, want: int) -> set[int]:
    """Store positions carried by the records of ``topic``, until all 1..want are seen;
    what was seen once no new position came for a minute (the caller's assert names the
    missing ones)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: set[int] = set()

    async def all_seen() -> bool:
        for recs in (await consumer.getmany(timeout_ms=500)).values():
            for rec in recs:
                seen.add(int(dict(rec.headers)[STORE_POSITION_HEADER]))
        return len(seen) >= want

    try:
        with contextlib.suppress(Stalled):
            await until(all_seen, what=f"{want} positions in {topic}", progress=lambda: len(seen))
    finally:
        await consumer.stop()
    return seen


async def test_two_forwarders_through_a_restart_publish_every_position_one_at_a_time(
    kafka_bootstrap: str, pg: tuple[str, Outage], tmp_path: Path
) -> None:
    url, outage = pg
    ns = f"pgf{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, FWD_APP)
    topic = f"{ns}fwd-orders"
    total = 8000
    await append_to_store(url, [_order(i, "o", 97) for i in range(2000)])
    env = {"STREAMAPP_EVENT_STORE": url}
    args = ("forward", "-A", FWD_APP, "--poll-interval", "0.2", "--chunk", "200")
    fwds = [
        StreamappProc(args, kafka_bootstrap, ns, tmp_path / f"f{i}.log", extra_env=env)
        for i in (1, 2)
    ]

    try:
        fwds[0].start()
        await _wait_log(fwds[0], "starts at store position")
        fwds[1].start()
        await _wait_log(fwds[1], "waits: the forwarder lock is held")
        appending = asyncio.create_task(_append_slowly(url, 2000, total))
        while await topic_size(kafka_bootstrap, topic) < 2500:
            assert not appending.done() or appending.exception() is None
            await asyncio.sleep(0.1)
        before = await topic_size(kafka_bootstrap, topic)
        await outage.restart()

        async def published() -> bool:
            return await topic_size(kafka_bootstrap, topic) > before

        await until(
            published,
            what=f"publishing to {topic} resumed",
            progress=lambda: tuple(f.log_size() for f in fwds),
            poll_s=0.05,
            detail=lambda: [f.log_text()[-2000:] for f in fwds],
        )
        outage.since_up("publishing resumed")
        await _done(appending, lambda: topic_size(kafka_bootstrap, topic))
        seen = await _positions(kafka_bootstrap, topic, total)
        outage.since_up("every position forwarded")
        assert seen == set(range(1, total + 1)), (
            f"missing {sorted(set(range(1, total + 1)) - seen)[:20]}"
        )
        assert all(f.alive for f in fwds), "a forwarder exited"
    finally:
        for f in fwds:
            f.kill()
    logs = [f.log_text() for f in fwds]
    assert "lost the forwarder lock" in logs[0], logs[0][-3000:]  # the fault happened
    assert not any("Traceback" in log for log in logs), logs
    _assert_one_publisher(logs)
    # outage logging is bounded: a line or two per process, not one per retry
    for log in logs:
        assert log.count("connection lost") <= 3, log[-3000:]
        assert log.count("reading the store failed") <= 1, log[-3000:]


async def _append_slowly(url: str, start: int, end: int) -> None:
    """Orders ``start..end`` over 97 streams, 100 per append, about 1,000 a second."""
    store = await open_store(url)
    try:
        for i in range(start, end, 100):
            batch = [Append(_sid(j, "o", 97), [_order(j, "o", 97)]) for j in range(i, i + 100)]
            assert (await store.append_many(batch)).error is None
            await asyncio.sleep(0.05)
    finally:
        await store.close()


def _assert_one_publisher(logs: list[str]) -> None:
    """The forwarders' publishing intervals never overlap, and every chunk was published
    inside its forwarder's interval."""
    held = [_held(log) for log in logs]
    far = datetime.max
    for a in held[0]:
        for b in held[1]:
            assert (a[1] or far) <= b[0] or (b[1] or far) <= a[0], f"overlap {a} {b}"
    for log, spans in zip(logs, held, strict=True):
        for at in _published_at(log):
            assert any(s <= at <= (e or far) for s, e in spans), f"published at {at} unheld"


async def test_a_forwarder_whose_lock_session_is_killed_stops_before_the_other_publishes(
    kafka_bootstrap: str, pg_url_factory: PgUrlFactory, tmp_path: Path
) -> None:
    """The server stays up; only the holder's lock session is terminated. The holder
    notices, stops at once and waits for the lock; whichever takes it goes on from the
    checkpoint; never both publish, and every position is published."""
    async with pg_url_factory() as url:
        await _lock_session_killed(kafka_bootstrap, url, tmp_path)


async def _lock_session_killed(kafka_bootstrap: str, url: str, tmp_path: Path) -> None:
    ns = f"pgk{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, FWD_APP)
    topic = f"{ns}fwd-orders"
    total = 6000
    env = {"STREAMAPP_EVENT_STORE": url}
    args = ("forward", "-A", FWD_APP, "--poll-interval", "0.2", "--chunk", "100")
    fwds = [
        StreamappProc(args, kafka_bootstrap, ns, tmp_path / f"f{i}.log", extra_env=env)
        for i in (1, 2)
    ]

    try:
        fwds[0].start()
        await _wait_log(fwds[0], "starts at store position")
        fwds[1].start()
        await _wait_log(fwds[1], "waits: the forwarder lock is held")
        appending = asyncio.create_task(_append_slowly(url, 0, total))
        await _wait_size(kafka_bootstrap, topic, 1000, fwds)
        assert fwds[0].proc is not None
        killed = await _terminate_lock_session(url, fwds[0].proc.pid)
        assert killed == 1
        await _wait_log(fwds[0], "lost the forwarder lock")
        await until(  # one of them (either) holds it and goes on
            lambda: sum(f.log_text().count(" starts at store position ") for f in fwds) >= 2,
            what="a forwarder holding the lock again",
            progress=lambda: tuple(f.log_size() for f in fwds),
            poll_s=0.05,
            detail=lambda: [f.log_text()[-2000:] for f in fwds],
        )
        await _done(appending, lambda: topic_size(kafka_bootstrap, topic))
        seen = await _positions(kafka_bootstrap, topic, total)
        assert seen == set(range(1, total + 1))
        assert all(f.alive for f in fwds), "a forwarder exited"
    finally:
        for f in fwds:
            f.kill()
    logs = [f.log_text() for f in fwds]
    assert "lost the forwarder lock" in logs[0], logs[0][-3000:]
    _assert_one_publisher(logs)


async def _terminate_lock_session(url: str, pid: int) -> int:
    """Terminate the forwarder lock session of process ``pid``; how many were ended."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'streamapp-forwarder %%' "
            "AND application_name LIKE %s",
            (f"% pid {pid} %",),
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _wait_log(proc: StreamappProc, text: str) -> None:
    """Until ``proc`` logged ``text``; fails once its log stood still for a minute."""

    def grown() -> int:
        assert proc.alive, proc.log_text()[-3000:]
        return proc.log_size()

    await until(
        lambda: text in proc.log_text(),
        what=f"{text!r} logged",
        progress=grown,
        poll_s=0.05,
        detail=lambda: proc.log_text()[-3000:],
    )


async def _wait_size(bootstrap: str, topic: str, n: int, fwds: list[StreamappProc]) -> None:
    """Until ``topic`` holds ``n`` records; fails once neither its size nor the
    forwarders' logs moved for a minute."""
    size = [0]

    async def enough() -> bool:
        size[0] = await topic_size(bootstrap, topic)
        return size[0] >= n

    await until(
        enough,
        what=f"{n} records in {topic}",
        progress=lambda: (size[0], tuple(f.log_size() for f in fwds)),
        detail=lambda: fwds[0].log_text()[-3000:],
    )


async def _done(task: asyncio.Task[None], progress: Callable[[], Any]) -> None:
    """Until ``task`` is done (its exception raised), while ``progress`` moves."""
    await until(task.done, what=f"{task.get_name()} done", progress=progress)
    await task


# --- (c) a Kafka worker's catch-up ----------------------------------------------------------


async def _phases(worker: WorkerProc) -> list[dict[str, Any]]:
    status = await worker.status()
    return list(status["partitions"].values()) if status else []


@pytest.mark.acceptance  # make acceptance: a whole worker deployment through the outage
async def test_a_kafka_worker_catching_up_from_postgres_rides_out_a_restart(
    kafka_bootstrap: str, pg: tuple[str, Outage], tmp_path: Path
) -> None:
    url, outage = pg
    ns = f"pgc{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=2000, n_events=250_000, seed=3)
    await append_to_store(url, events, chunk=5000)
    worker = WorkerProc(
        kafka_bootstrap,
        ns,
        tmp_path / "data",
        tmp_path / "w.log",
        extra_env={"STREAMAPP_EVENT_STORE": url},
    ).start()
    try:

        async def catching_up() -> bool:
            return any(p["phase"] == "catching_up" for p in await _phases(worker))

        await until(
            catching_up,
            what="a partition catching up",
            progress=lambda: worker_progress([worker]),
            poll_s=0.02,
            detail=lambda: worker.log_text()[-3000:],
        )
        await outage.down()
        phases = {p["phase"] for p in await _phases(worker)}
        assert phases & {"restoring", "catching_up"}, f"caught up before the outage: {phases}"
        await asyncio.sleep(DOWN_S)
        await outage.up()
        await wait_group_ready([worker], 8, stalled_s=120)
        outage.since_up("all partitions live")
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
        outage.since_up("tables exact")
        assert worker.alive
    finally:
        worker.kill()
    log = worker.log_text()
    assert "connection lost" in log, log[-3000:]  # the fault reached the worker
    assert log.count("connection lost") <= 3, log[-3000:]
    assert "opening failed" not in log, log[-3000:]


# --- (d) a RabbitMQ partition move --------------------------------------------------------


@pytest.mark.acceptance  # make acceptance: a whole worker deployment through the outage
async def test_a_rabbitmq_partition_moved_while_postgres_is_down_replays_once_it_is_back(
    services: Services, pg: tuple[str, Outage], tmp_path: Path
) -> None:
    """Two RabbitMQ workers share the partitions; PostgreSQL goes down, one worker leaves,
    its partitions move to the other, which must replay them from the store: it does once
    the server is back, and every order ends exact."""
    url, outage = pg
    ns = f"pgr{uuid.uuid4().hex[:6]}-"
    env = rabbit_env(services.amqp, STREAMAPP_EVENT_STORE=url, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    events, expected = order_events(n_orders=500, n_events=20_000, seed=5)
    await append_to_store(url, events[:15_000])
    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app", "--chunk", "500"),
        "127.0.0.1:1",
        ns,
        tmp_path / "fwd.log",
        extra_env=env,
    ).start()
    workers = [
        WorkerProc("127.0.0.1:1", ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w1", "w2")
    ]
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        mine = set((await wait_ready(workers[0]))["partitions"])
        await outage.down()
        assert workers[1].stop() == 0  # leaves: its partitions move to w1

        async def took_all() -> bool:
            return len((await workers[0].status() or {}).get("partitions", {})) >= 8

        await until(
            took_all,
            what="w1 owning all 8 partitions",
            progress=lambda: worker_progress(workers[:1]),
            detail=lambda: workers[0].log_text()[-3000:],
        )
        status = await workers[0].status()
        assert status is not None
        moved = {n: p["phase"] for n, p in status["partitions"].items() if n not in mine}
        assert moved, status
        assert not status["ready"], f"moved partitions went live without the store: {moved}"
        await asyncio.sleep(DOWN_S)
        await outage.up()
        await wait_ready(workers[0], 120)
        outage.since_up("moved partitions live")
        _, before = order_events(n_orders=500, n_events=15_000, seed=5)  # the same prefix
        await _read_exact(workers[:1], before)
        outage.since_up("tables exact (events stored before the outage)")
        await append_to_store(url, events[15_000:])
        await _drained(services.amqp, ns, url, len(events), 120)
        await _read_exact(workers[:1], expected)
        outage.since_up("tables exact (5,000 more appended and forwarded after it)")
        assert workers[0].alive
        assert forwarder.alive
    finally:
        forwarder.kill()
        for w in workers:
            if w.alive:
                w.kill()
    log = workers[0].log_text()
    assert "connection lost" in log, log[-3000:]


# --- the embedded worker's lock ---------------------------------------------------------


async def test_a_store_only_worker_keeps_following_and_its_lock_through_a_restart(
    pg: tuple[str, Outage], tmp_path: Path
) -> None:
    """STREAMAPP_BROKER=none: the worker follows the store again after the restart, and
    takes its worker lock again, so a second worker is still refused."""
    url, outage = pg
    ns = f"pgn{uuid.uuid4().hex[:6]}-"
    env = {"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url}
    events, expected = order_events(n_orders=300, n_events=10_000, seed=9)
    await append_to_store(url, events[:5000])
    first = WorkerProc("127.0.0.1:1", ns, tmp_path / "d1", tmp_path / "w1.log", extra_env=env)
    second = WorkerProc("127.0.0.1:1", ns, tmp_path / "d2", tmp_path / "w2.log", extra_env=env)
    try:
        first.start()
        await wait_ready(first)
        await outage.restart()
        await append_to_store(url, events[5000:])
        await _read_exact([first], expected)
        outage.since_up("tables exact")
        await until(
            lambda: re.search(r"worker lock of app .*: reconnected after", first.log_text()),
            what="the worker lock reconnected",
            progress=lambda: worker_progress([first]),
            detail=lambda: first.log_text()[-3000:],
        )
        second.start()
        assert second.proc is not None
        proc = second.proc
        await until(
            lambda: proc.poll() is not None,
            what="the second worker refused",
            progress=second.log_size,
        )
        assert proc.returncode != 0
        assert "already runs on the event store" in second.log_text(), second.log_text()
        assert first.alive
    finally:
        for w in (first, second):
            if w.alive:
                w.kill()
    log = first.log_text()
    assert "connection lost during holding the worker lock" in log, log[-3000:]


async def test_a_store_only_worker_whose_lock_was_taken_over_stops(
    pg_url_factory: PgUrlFactory, tmp_path: Path
) -> None:
    """Its lock session is ended and another session takes the worker lock before the
    worker takes it again: the worker stops, naming the holder (two embedded workers
    of one app never run at once)."""
    import psycopg

    ns = f"pgt{uuid.uuid4().hex[:6]}-"
    async with pg_url_factory() as url:
        env = {"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url}
        events, _ = order_events(n_orders=50, n_events=500, seed=2)
        await append_to_store(url, events)
        worker = WorkerProc("127.0.0.1:1", ns, tmp_path / "d", tmp_path / "w.log", extra_env=env)
        worker.start()
        try:
            await wait_ready(worker)
            assert worker.proc is not None
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
                cur = await other.execute(
                    "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'streamapp-worker %%' "
                    "AND application_name LIKE %s",
                    (f"% pid {worker.proc.pid} %",),
                )
                assert (await cur.fetchone()) == (1,)
                # pg_terminate_backend(pid, timeout) returned once the session was gone, so
                # its lock is free; the worker takes it again no sooner than its 0.5 s poll.
                cur = await other.execute(
                    "SELECT pg_try_advisory_lock(hashtext(current_schema() || %s), 7404)",
                    (f"{ns}orders",),
                )
                assert (await cur.fetchone()) == (True,), "the worker kept its lock"
                proc = worker.proc
                await until(
                    lambda: proc.poll() is not None,
                    what="the worker that lost its lock exiting",
                    progress=worker.log_size,
                )
                code = proc.returncode
        finally:
            if worker.alive:
                worker.kill()
    log = worker.log_text()
    assert code != 0, log[-3000:]
    assert "which took the lock while this worker's session was lost" in log, log[-3000:]
