"""``streamapp verify`` and ``streamapp versions`` on real workers (tests/apps/verify_app.py):

- under a live load (events appended to the store, and forwarded to the broker, while
  verify runs) a correct deploy verifies with 0 differences: embedded, RabbitMQ (a
  worker with the store's history), Kafka with 2 workers (verify asks one, the keys of
  the other's partitions are forwarded to it);
- each fault is reported with exactly its keys, and exit 1: a handler that reads the
  clock and a value edited in a stopped worker's RocksDB store (embedded, RabbitMQ,
  Kafka), a record removed from a Kafka changelog that a fresh worker restores from;
- ``versions diff`` counts exactly the streams whose events the changed handler treats
  differently, and a manual version switches group-wide (2 Kafka workers) on the command.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamapp import Event
from streamapp.eventstore import Append, open_store
from streamapp.topics import partition_for
from tests.conftest import Services
from tests.support.waits import until

from .harness import (
    ROOT,
    StreamappProc,
    WorkerProc,
    alive,
    app_env,
    append_to_store,
    create_topics,
    streamapp_cmd,
    wait_group_ready,
    wait_ready,
    worker_progress,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.verify_app:app"
NO_KAFKA = "127.0.0.1:1"
TYPES = ("order.paid", "order.shipped", "order.cancelled")
BROKERS = ["embedded", "rabbitmq", "kafka"]


def stream_events(n_streams: int, per_stream: int, seed: int = 3) -> list[Event]:
    """``order.placed`` then ``per_stream - 1`` random others, for each of ``n_streams``
    streams, interleaved (the store's order is not a stream's)."""
    rng = random.Random(seed)
    todo = {f"order-{i:04d}": per_stream for i in range(n_streams)}
    out: list[Event] = []
    while todo:
        sid = rng.choice(sorted(todo))
        first = todo[sid] == per_stream
        kind = "order.placed" if first else rng.choice(TYPES)
        out.append(Event.create(kind, stream_id=sid, source="tests", data={"n": len(out)}))
        todo[sid] -= 1
        if not todo[sid]:
            del todo[sid]
    return out


def streams_with(events: list[Event], kind: str) -> set[str]:
    return {e.stream_id or "" for e in events if e.type == kind}


def _verify(w: WorkerProc, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _cli(w, "verify", "totals", "--url", f"http://127.0.0.1:{w.port}", *args, **env)


def _cli(w: WorkerProc, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        streamapp_cmd(*args, "-A", APP),
        env=app_env(w.bootstrap, w.namespace, **(w.extra_env | env)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a ceiling for a hang, not a budget
        check=False,
    )


def _found(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode in (0, 1), out.stdout + out.stderr
    found: dict[str, Any] = json.loads(out.stdout)
    return found


async def _applied(workers: list[WorkerProc]) -> int:
    """Events the workers applied (their partitions' delivered counts)."""
    total = 0
    for w in workers:
        status = await w.status() or {}
        for p in status.get("partitions", {}).values():
            total += p.get("outcomes", {}).get("delivered", 0)
    return total


async def _head(url: str) -> int:
    store = await open_store(url)
    try:
        return await store.head()
    finally:
        await store.close()


async def _wait_verified(w: WorkerProc, n: int, **env: str) -> dict[str, Any]:
    """Until verify has checked ``n`` streams, all equal (the worker caught up on them:
    a stream it has not applied yet is 'missing' live). Fails when the worker stalls."""
    seen: list[dict[str, Any]] = [{}]

    async def check() -> bool:
        seen[0] = _found(await asyncio.to_thread(_verify, w, "--json", **env))
        return bool(seen[0]["checked"] == n and seen[0]["missing"] == 0)

    await until(check, what=f"{n} streams applied", progress=lambda: worker_progress([w]),
                detail=lambda: seen[0], poll_s=0.5)  # fmt: skip
    return seen[0]


class Load:
    """Events appended to the store while it runs: new events of existing streams and
    new streams, a small batch at a time (a live load, paced, not a burst)."""

    def __init__(self, url: str, streams: list[str], seed: int = 11) -> None:
        self.url, self.streams, self.rng = url, list(streams), random.Random(seed)
        self.appended = 0
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Load:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        store = await open_store(self.url)
        try:
            while not self.stop.is_set():
                batch = []
                for _ in range(10):
                    if self.rng.random() < 0.2:
                        sid = f"live-{len(self.streams):05d}"
                        self.streams.append(sid)
                        kind = "order.placed"
                    else:
                        sid, kind = self.rng.choice(self.streams), self.rng.choice(TYPES)
                    e = Event.create(kind, stream_id=sid, source="tests", data={"n": 1})
                    batch.append(Append(sid, [e]))
                result = await store.append_many(batch)
                assert result.error is None, result.error
                self.appended += len(batch)
                await asyncio.sleep(0.02)  # pacing the load, not a wait
        finally:
            await store.close()

    async def finish(self) -> None:
        self.stop.set()
        assert self.task is not None
        await self.task


async def _verify_under_load(
    workers: list[WorkerProc], url: str, events: list[Event]
) -> dict[str, Any]:
    """``verify`` of the first worker while a load is appended (and applied): 0 differ."""
    asked = workers[0]
    streams = sorted({e.stream_id or "" for e in events})
    load = Load(url, streams).start()
    try:
        # the load is applied before verify starts: the worker is live, not idle
        start = await _applied(workers)
        await until(lambda: _moved(workers, start), what="the load applied",
                    progress=lambda: worker_progress(workers), poll_s=0.2)  # fmt: skip
        head_before, applied_before = await _head(url), await _applied(workers)
        out = await asyncio.to_thread(_verify, asked, "--json")
        head_after, applied_after = await _head(url), await _applied(workers)
    finally:
        await load.finish()
    alive(workers)
    found = _found(out)
    assert head_after > head_before, "nothing appended while verify ran"
    assert applied_after > applied_before, "nothing applied while verify ran"
    assert found["checked"] >= len(streams), found
    assert (found["differ"], found["missing"]) == (0, 0), found
    assert out.returncode == 0
    return found


async def _moved(workers: list[WorkerProc], start: int) -> bool:
    return await _applied(workers) > start


def _embedded(tmp: Path, url: str, name: str = "w", **env: str) -> WorkerProc:
    return WorkerProc(
        NO_KAFKA,
        f"vw{uuid.uuid4().hex[:6]}-",
        tmp / name,
        tmp / f"{name}.log",
        app_ref=APP,
        extra_env={"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url, **env},
    )


def _worker_on(broker: str, services: Services, tmp: Path, url: str, **env: str) -> WorkerProc:
    """One worker of the app on ``broker`` (its topics made), reading ``url``'s history."""
    env = {"STREAMAPP_EVENT_STORE": url, **env}
    if broker == "embedded":
        return _embedded(tmp, url, **env)
    ns = f"vw{broker[0]}{uuid.uuid4().hex[:6]}-"
    kafka = services.kafka if broker == "kafka" else NO_KAFKA
    if broker == "rabbitmq":
        env |= {"STREAMAPP_BROKER": "rabbitmq", "STREAMAPP_AMQP_URL": services.amqp}
    w = WorkerProc(kafka, ns, tmp / "w", tmp / "w.log", APP, extra_env=env)
    created = _cli(w, "topics", "create")
    assert created.returncode == 0, created.stderr
    return w


async def test_verify_under_live_load_embedded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(300, 4)
    await append_to_store(url, events)
    w = _embedded(tmp_path, url).start()
    try:
        await wait_ready(w)
        await _wait_verified(w, 300)
        await _verify_under_load([w], url, events)
    finally:
        w.stop()


async def test_verify_under_live_load_rabbitmq(services: Services, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(300, 4)
    await append_to_store(url, events)  # the worker's history: it replays the store first
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": services.amqp,
        "STREAMAPP_EVENT_STORE": url,
    }
    ns = f"vwr{uuid.uuid4().hex[:6]}-"
    w = WorkerProc(NO_KAFKA, ns, tmp_path / "w", tmp_path / "w.log", APP, extra_env=env)
    created = _cli(w, "topics", "create")
    assert created.returncode == 0, created.stderr
    forwarder = StreamappProc(("forward", "-A", APP), NO_KAFKA, ns, tmp_path / "fwd.log", env)
    w.start()
    forwarder.start()
    try:
        await wait_ready(w)
        await _wait_verified(w, 300)
        await _verify_under_load([w], url, events)
        assert forwarder.alive, forwarder.log_text()[-3000:]
    finally:
        forwarder.kill()
        w.stop()


async def test_verify_under_live_load_kafka_two_workers(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(300, 4)
    await append_to_store(url, events)
    ns = f"vwk{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    env = {"STREAMAPP_EVENT_STORE": url}
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / f"w{i}", tmp_path / f"w{i}.log", APP,
                   extra_env=dict(env))
        for i in range(2)
    ]  # fmt: skip
    forwarder = StreamappProc(
        ("forward", "-A", APP), kafka_bootstrap, ns, tmp_path / "fwd.log", dict(env)
    )
    for w in workers:
        w.start()
    forwarder.start()
    try:
        await wait_group_ready(workers, 4)
        owned = [set((await w.status() or {})["partitions"]) for w in workers]
        assert all(owned), owned  # each owns some partitions
        assert not owned[0] & owned[1], owned
        await _wait_verified(workers[0], 300)
        await _verify_under_load(workers, url, events)
        assert forwarder.alive, forwarder.log_text()[-3000:]
        await wait_group_ready(workers, 4)  # no rebalance hid a partition from verify
    finally:
        forwarder.kill()
        for w in workers:
            w.stop()


@pytest.mark.parametrize("broker", BROKERS)
async def test_verify_names_the_streams_of_a_handler_that_reads_the_clock(
    services: Services, tmp_path: Path, broker: str
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = [e for e in stream_events(40, 3) if e.type != "order.shipped"]
    shipped = ["order-0003", "order-0017", "order-0029"]
    events += [Event.create("order.shipped", stream_id=s, data={}) for s in shipped]
    await append_to_store(url, events)
    w = _worker_on(broker, services, tmp_path, url, STREAMAPP_TEST_VERIFY_CLOCK="1").start()
    try:
        await wait_ready(w)
        await until(lambda: _moved([w], len(events) - 1), what="all applied",
                    progress=lambda: worker_progress([w]), poll_s=0.2)  # fmt: skip
        out = await asyncio.to_thread(_verify, w, "--json")
    finally:
        w.stop()
    found = _found(out)
    assert out.returncode == 1, out.stdout
    assert (found["checked"], found["differ"], found["missing"]) == (40, 3, 0), found
    assert sorted(d["key"] for d in found["differences"]) == shipped
    for d in found["differences"]:
        assert d["live"]["shipped_at"] != d["rebuilt"]["shipped_at"]


def _rocks(path: Path) -> Any:
    from rocksdict import Options, Rdict

    names = [n for n in Rdict.list_cf(str(path)) if n != "default"]
    return Rdict(str(path), Options(raw_mode=True),
                 column_families={n: Options(raw_mode=True) for n in names})  # fmt: skip


@pytest.mark.parametrize("broker", BROKERS)
async def test_verify_names_a_value_edited_in_the_rocksdb_store(
    services: Services, tmp_path: Path, broker: str
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(40, 3)
    await append_to_store(url, events)
    w = _worker_on(broker, services, tmp_path, url)
    w.start()
    try:
        await wait_ready(w)
        await until(lambda: _moved([w], len(events) - 1), what="all applied",
                    progress=lambda: worker_progress([w]), poll_s=0.2)  # fmt: skip
        clean = _found(await asyncio.to_thread(_verify, w, "--json"))
        assert (clean["equal"], clean["differ"]) == (40, 0), clean
    finally:
        assert w.stop() == 0
    key = "order-0021"
    part = partition_for(key.encode(), 4)
    store = tmp_path / "w" / f"{w.namespace}verify" / "total" / str(part)
    db = _rocks(store)
    try:
        family = db.get_column_family("t:totals")
        value = orjson.loads(family[key.encode()])
        value["paid"] += 1000
        family[key.encode()] = orjson.dumps(value)
        del family
    finally:
        db.close()
    w.start()
    try:
        await wait_ready(w)
        out = await asyncio.to_thread(_verify, w, "--json")
    finally:
        w.stop()
    found = _found(out)
    assert out.returncode == 1, out.stdout
    assert (found["checked"], found["differ"], found["missing"]) == (40, 1, 0), found
    (d,) = found["differences"]
    assert d["key"] == key
    assert d["live"]["paid"] == d["rebuilt"]["paid"] + 1000


async def _changelog_records(bootstrap: str, tp: TopicPartition) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed")  # fmt: skip
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[Any] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            out += batch.get(tp, [])
        return out
    finally:
        await consumer.stop()


async def _write_committed(
    bootstrap: str, tp: TopicPartition, key: bytes, value: bytes | None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                transactional_id=f"{tp.topic}-damage")  # fmt: skip
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send(tp.topic, value, key=key, partition=tp.partition)
        await producer.commit_transaction()
    finally:
        await producer.stop()


async def test_verify_names_the_key_of_a_record_removed_from_the_changelog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(40, 3)
    await append_to_store(url, events)
    ns = f"vwc{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    env = {"STREAMAPP_EVENT_STORE": url}
    w = WorkerProc(kafka_bootstrap, ns, tmp_path / "w", tmp_path / "w.log", APP, extra_env=env)
    forwarder = StreamappProc(
        ("forward", "-A", APP), kafka_bootstrap, ns, tmp_path / "fwd.log", env
    )
    key = "order-0021"
    w.start()
    forwarder.start()
    try:
        await wait_ready(w)
        await until(lambda: _moved([w], len(events) - 1), what="all applied",
                    progress=lambda: worker_progress([w]), poll_s=0.2)  # fmt: skip
        # one more event of the key, applied live (forwarded): its second changelog record
        await append_to_store(url, [Event.create("order.paid", stream_id=key, data={"n": 7})])
        await until(lambda: _moved([w], len(events)), what="the live event applied",
                    progress=lambda: worker_progress([w]), poll_s=0.2)  # fmt: skip
        clean = _found(await asyncio.to_thread(_verify, w, "--json"))
        assert (clean["equal"], clean["differ"]) == (40, 0), clean
    finally:
        forwarder.kill()
        assert w.stop() == 0
    # The last record of the key's value removed: what a restore then reads for it is its
    # previous record. Written as a committed record after the others (the changelog is
    # compacted: its newest record of a key is the value restored).
    tp = TopicPartition(f"{ns}verify-total-changelog", partition_for(key.encode(), 4))
    data_key = b"dtotals\x00" + key.encode()
    mine = [r for r in await _changelog_records(kafka_bootstrap, tp) if r.key == data_key]
    assert len(mine) >= 2, f"{len(mine)} changelog records of {key} in {tp}"
    previous = mine[-2].value
    assert previous is not None
    await _write_committed(kafka_bootstrap, tp, data_key, previous)
    shutil.rmtree(tmp_path / "w")  # a fresh worker: it restores from the changelog
    w.start()
    try:
        await wait_ready(w)
        out = await asyncio.to_thread(_verify, w, "--json")
    finally:
        w.stop()
    found = _found(out)
    assert out.returncode == 1, out.stdout
    assert (found["checked"], found["differ"], found["missing"]) == (40, 1, 0), found
    (d,) = found["differences"]
    assert d["key"] == key
    assert d["kind"] == "differ"
    assert d["live"] == orjson.loads(previous)  # the value before the live event
    assert d["rebuilt"]["paid"] == d["live"]["paid"] + 7


HEADER = "Streamapp-Table-Version"


async def _totals_versions(http: aiohttp.ClientSession, w: WorkerProc) -> dict[int, str]:
    """Each version of ``totals`` and its state, as the worker's ``GET /tables`` lists it."""
    async with http.get(f"http://127.0.0.1:{w.port}/tables", headers=w.auth) as r:
        tables = (await r.json())["tables"]
    (table,) = [t for t in tables if t["name"] == "totals"]
    return {v["version"]: v["state"] for v in table["versions"]}


async def _served_by(http: aiohttp.ClientSession, w: WorkerProc, key: str) -> tuple[int, Any]:
    """The version that answers ``key`` on ``w`` (its header) and the value; 503s (a
    partition restoring, a rebalance) are asked again, a bounded number of times."""
    for _ in range(100):
        url = f"http://127.0.0.1:{w.port}/tables/totals/{key}"
        async with http.get(url, headers=w.auth) as r:
            body = await r.json()
            if r.status != 503:
                assert r.status == 200, (w.port, key, r.status, body)
                return int(r.headers[HEADER]), body
        await asyncio.sleep(0.1)  # a bounded retry of a 503, not a wait
    raise AssertionError(f"{key} from {w.port}: still 503")


async def test_versions_diff_counts_the_changed_streams_and_the_switch_is_group_wide(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events = stream_events(120, 3, seed=5)
    await append_to_store(url, events)
    cancelled = streams_with(events, "order.cancelled")  # v2 differs on these only
    assert 0 < len(cancelled) < 120
    ns = f"vwv{uuid.uuid4().hex[:6]}-"
    env = {"STREAMAPP_EVENT_STORE": url, "STREAMAPP_TEST_VERIFY_V2": "1"}
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / f"w{i}", tmp_path / f"w{i}.log", APP,
                   extra_env=dict(env))
        for i in range(2)
    ]  # fmt: skip
    created = _cli(workers[0], "topics", "create")  # v1 and v2 changelogs, members
    assert created.returncode == 0, created.stderr
    for w in workers:
        w.start()
    try:
        await wait_group_ready(workers, 4)
        async with aiohttp.ClientSession() as http:
            states: list[dict[int, str]] = []

            async def built() -> bool:
                states[:] = [await _totals_versions(http, w) for w in workers]
                return all(s.get(2) == "built" for s in states)

            await until(built, what="totals v2 built on both workers", poll_s=0.3,
                        progress=lambda: worker_progress(workers),
                        detail=lambda: states)  # fmt: skip
            assert all(s[1] == "active" for s in states), states

            diff = _cli(workers[0], "versions", "diff", "totals", "--from", "1", "--to", "2",
                        "--sample", "1000", "--json")  # fmt: skip
            assert diff.returncode == 0, diff.stdout + diff.stderr
            found = json.loads(diff.stdout)
            assert (found["checked"], found["differ"]) == (120, len(cancelled)), found
            assert {e["key"] for e in found["examples"]} <= cancelled
            for e in found["examples"]:
                assert e["to"] == e["from"] | {"cancelled": True}

            keys = sorted({e.stream_id or "" for e in events})[:20]  # on both workers
            for w in workers:  # built, not active: every worker answers v1
                for key in keys:
                    assert (await _served_by(http, w, key))[0] == 1

            switched = _cli(workers[0], "versions", "switch", "totals", "--version", "2",
                            "--url", f"http://127.0.0.1:{workers[0].port}")  # fmt: skip
            assert switched.returncode == 0, switched.stdout + switched.stderr

            async def active() -> bool:
                states[:] = [await _totals_versions(http, w) for w in workers]
                return all(s.get(2) == "active" for s in states)

            await until(active, what="totals v2 active on both workers", poll_s=0.3,
                        progress=lambda: worker_progress(workers),
                        detail=lambda: states)  # fmt: skip
            for w in workers:
                for key in keys:
                    version, value = await _served_by(http, w, key)
                    assert version == 2, (w.port, key)
                    assert value.get("cancelled", False) == (key in cancelled)
    finally:
        for w in workers:
            w.stop()
