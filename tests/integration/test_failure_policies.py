"""Failure policies on real Kafka: PARK keeps the partition going, REDELIVER applies once,
a bounded REDELIVER parks after its attempts (live and during catch-up)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import App, Event, FromEventStore, Park, Redeliver, Refuse, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.engine.phase import Phase
from streamapp.errors import AgentRefusedError
from streamapp.eventstore import Append, open_store
from streamapp.topics import partition_for
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
from tests.support.tasks import source_progress
from tests.support.waits import finished, until

from .harness import WorkerProc, create_topics, lag, read_table, wait_caught_up, wait_ready

pytestmark = pytest.mark.integration


async def _send_raw(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list[Any]]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str, n: int) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    got: list[Any] = []
    try:

        async def enough() -> bool:
            batch = await consumer.getmany(timeout_ms=500)
            got.extend(r for recs in batch.values() for r in recs)
            return len(got) >= n

        await until(enough, what=f"{n} records in {topic}", progress=lambda: len(got), poll_s=0)
        extra = await consumer.getmany(timeout_ms=1000)  # nothing more than expected
        got += [r for recs in extra.values() for r in recs]
    finally:
        await consumer.stop()
    return sorted(got, key=lambda r: (r.partition, r.offset))


async def test_park_bad_records_and_go_on(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns = f"park{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    oid = "order-park"

    def good(kind: str) -> tuple[bytes, bytes, list[Any]]:
        key, value, headers = codec.encode(Event.create(f"order.{kind}", stream_id=oid, data={}))
        assert key is not None
        assert value is not None
        return key, value, headers

    no_stream_id = [(n, v) for n, v in good("placed")[2] if n != "ce_streamid"]
    records = [
        good("placed"),
        (oid.encode(), b"plain text, not a CloudEvent", []),
        # application/json, invalid JSON: the orders handler never reads data, so it
        # applies it (a handler that reads it parks it: tests/contract)
        (oid.encode(), b"{not json", good("paid")[2]),
        (oid.encode(), b"{}", no_stream_id),  # a CloudEvent without a stream id
        good("paid"),
        good("shipped"),
    ]
    await _send_raw(kafka_bootstrap, f"{ns}orders", records)

    worker = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        await wait_ready(worker)
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 60, [worker])
        table = await read_table([worker], "order_status", [oid, "order-never-seen"])
        assert table[oid]["status"] == "shipped"
        assert table[oid]["version"] == 4  # the four CloudEvents, each once
        assert table["order-never-seen"] is None  # answered 404 by its owner
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{worker.port}/tables/no_such_table/x") as r,
        ):
            assert r.status == 404
            assert "no table named 'no_such_table'" in (await r.json())["error"]
    finally:
        assert worker.stop() == 0

    parked = await _read_all(kafka_bootstrap, f"{ns}orders.parked", 2)
    assert len(parked) == 2
    reasons = [dict(r.headers)["streamapp-park-reason"].decode() for r in parked]
    assert "not a CloudEvent" in reasons[0]
    assert "no stream id" in reasons[1]
    assert [r.value for r in parked] == [records[1][1], records[3][1]]
    assert all(r.key == oid.encode() for r in parked)
    p = partition_for(oid.encode(), 8)
    sources = [dict(r.headers)["streamapp-source"].decode() for r in parked]
    assert sources == [f"{ns}orders/{p}/1", f"{ns}orders/{p}/3"]


async def test_redeliver_applies_once_and_other_partitions_flow(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"flaky{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    topic = app.topic(f"{ns}in", partitions=4)
    counts_table: Table[dict[str, int]] = Table("counts")
    calls: Counter[str] = Counter()
    flaky_id = "flaky-event"

    @app.agent(topic, tables=[counts_table], on_failure=Redeliver(pause_s=1.5))
    async def count(event: Event, counts: TableView[dict[str, int]]) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        counts[sid] = {"n": counts.get(sid, {"n": 0})["n"] + 1}
        if event.id == flaky_id and calls[event.id] <= 2:
            raise RuntimeError("transient failure")  # after a write: it must be rolled back

    settings = app.settings()
    await create_app_topics(app, settings)
    keys = {partition_for(f"k{i}".encode(), 4): f"k{i}" for i in range(40)}
    stuck_key = keys[0]
    others = [keys[p] for p in (1, 2, 3)]
    events = [Event.create("e", stream_id=stuck_key, data={}, id=flaky_id)]
    events += [Event.create("e", stream_id=stuck_key, data={}) for _ in range(5)]
    events += [Event.create("e", stream_id=k, data={}) for k in others for _ in range(20)]
    await _send_raw(kafka_bootstrap, topic.name, [codec.encode(e) for e in events])  # type: ignore[misc]

    worker = Worker(app, settings)
    await worker.start()
    try:
        url = f"http://127.0.0.1:{worker.web_port}/tables/counts/"
        seen_while_stuck = False
        async with aiohttp.ClientSession() as http:

            async def n_of(key: str) -> int:
                async with http.get(url + key) as r:
                    return int((await r.json())["n"]) if r.status == 200 else 0

            counted: list[int] = []

            async def done() -> bool:
                nonlocal seen_while_stuck
                counted[:] = [await n_of(k) for k in (*others, stuck_key)]
                others_done, stuck = all(n == 20 for n in counted[:-1]), counted[-1]
                if others_done and stuck == 0:
                    seen_while_stuck = True
                return others_done and stuck == 6

            await until(
                done,
                what="every key counted",
                progress=lambda: (tuple(counted), sum(calls.values())),
                poll_s=0.1,
            )
            assert await n_of(stuck_key) == 6  # the flaky event counted once, not three times
        assert seen_while_stuck  # the other partitions finished while partition 0 waited
        assert calls[flaky_id] == 3
        assert all(n == 1 for eid, n in calls.items() if eid != flaky_id)
    finally:
        await worker.stop()


async def test_a_slow_batch_is_cut_by_the_budget_and_flushed_in_parts(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"budget{uuid.uuid4().hex[:6]}-"
    app = App(
        f"{ns}app",
        kafka_bootstrap=kafka_bootstrap,
        data_dir=tmp_path,
        web_port=0,
        batch_budget_ms=300,
    )
    topic = app.topic(f"{ns}in", partitions=1)
    seen: Table[int] = Table("seen")

    @app.agent(topic, tables=[seen])
    async def slow(event: Event, counts: TableView[int]) -> None:
        await asyncio.sleep(0.02)  # 60 events: ~1.2 s of work, four budgets
        sid = event.stream_id
        assert sid is not None
        counts[sid] = counts.get(sid, 0) + 1

    settings = app.settings()
    await create_app_topics(app, settings)
    events = [Event.create("e", stream_id=f"k{i % 3}", data={}) for i in range(60)]
    await _send_raw(kafka_bootstrap, topic.name, [codec.encode(e) for e in events])  # type: ignore[misc]

    worker = Worker(app, settings)
    await worker.start()
    try:
        behind: list[int] = []

        async def committed() -> bool:
            behind.append(await lag(kafka_bootstrap, app.id, topic.name))
            return behind[-1] == 0

        await until(committed, what="the lag gone", progress=lambda: behind[-1], poll_s=0.05)
        partial = {n for n in behind if 0 < n < 60}
        assert len(partial) >= 2, behind  # committed in several parts, not once at the end
        runner = next(iter(worker.source.assignment.tasks.values()))
        # the offset commits in the transaction, the store right after
        await until(lambda: not runner.busy, what="the batch done", stalled_s=30, poll_s=0.05)
        assert runner.tables is not None
        view = runner.tables.views[0]
        assert [view.get(f"k{i}") for i in range(3)] == [20, 20, 20]
    finally:
        await worker.stop()


async def test_bounded_redeliver_parks_after_its_attempts_and_the_partition_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Redeliver(max_attempts=3, fallback=Park(...)) on a handler that always fails for
    one record: three calls, pauses doubling, then the record is in the parking topic with
    its reason, the records behind it in its partition are applied and committed."""
    ns = f"bound{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    topic = app.topic(f"{ns}in", partitions=2)
    parking = f"{ns}in.parked"
    counts_table: Table[dict[str, int]] = Table("counts")
    calls: dict[str, list[float]] = {}
    poison_id = "poison-event"
    policy = Redeliver(pause_s=0.4, max_attempts=3, fallback=Park(parking))

    @app.agent(topic, tables=[counts_table], on_failure=policy)
    async def count(event: Event, counts: TableView[dict[str, int]]) -> None:
        calls.setdefault(event.id, []).append(time.monotonic())
        sid = event.stream_id
        assert sid is not None
        counts[sid] = {"n": counts.get(sid, {"n": 0})["n"] + 1}
        if event.id == poison_id:
            raise RuntimeError("always broken")  # after a write: it must be rolled back

    settings = app.settings()
    assert settings.redeliver_backoff_max_ms == 30_000
    await create_app_topics(app, settings)  # the fallback's parking topic too
    keys = {partition_for(f"k{i}".encode(), 2): f"k{i}" for i in range(40)}
    stuck_key, other_key = keys[0], keys[1]
    events = [Event.create("e", stream_id=stuck_key, data={}) for _ in range(2)]
    events += [Event.create("e", stream_id=stuck_key, data={}, id=poison_id)]
    events += [Event.create("e", stream_id=stuck_key, data={}) for _ in range(5)]
    events += [Event.create("e", stream_id=other_key, data={}) for _ in range(10)]
    await _send_raw(kafka_bootstrap, topic.name, [codec.encode(e) for e in events])  # type: ignore[misc]

    worker = Worker(app, settings)
    await worker.start()
    try:
        url = f"http://127.0.0.1:{worker.web_port}/tables/counts/"
        async with aiohttp.ClientSession() as http:

            async def n_of(key: str) -> int:
                async with http.get(url + key) as r:
                    return int((await r.json())["n"]) if r.status == 200 else 0

            counted: list[int] = []

            async def done() -> bool:
                counted[:] = [await n_of(stuck_key), await n_of(other_key)]
                return counted == [7, 10]

            await until(
                done,
                what="7 and 10 counted",
                progress=lambda: (tuple(counted), sum(len(t) for t in calls.values())),
                poll_s=0.1,
            )
            assert await n_of(stuck_key) == 7  # the 7 good records of the partition, once
            assert await n_of(other_key) == 10
        await _lag_gone(kafka_bootstrap, app.id, topic.name)
        assert await lag(kafka_bootstrap, app.id, topic.name) == 0  # committed past it
        assert len(calls[poison_id]) == 3
        gaps = [b - a for a, b in itertools.pairwise(calls[poison_id])]
        assert gaps[0] >= 0.4 * 0.9, gaps  # the first pause is pause_s,
        assert gaps[1] >= 0.8 * 0.9, gaps  # then it doubles
        assert all(len(t) == 1 for eid, t in calls.items() if eid != poison_id)
    finally:
        await worker.stop()

    (parked,) = await _read_all(kafka_bootstrap, parking, 1)
    headers = dict(parked.headers)
    reason = headers["streamapp-park-reason"].decode()
    assert reason == "gave up after 3 attempts: RuntimeError: always broken"
    assert headers["streamapp-source"].decode() == f"{topic.name}/0/2"
    assert headers["streamapp-agent"] == b"count"
    assert headers["ce_id"] == poison_id.encode()
    assert parked.key == stuck_key.encode()
    assert parked.partition == 0  # parked to the partition of its key


async def test_bounded_redeliver_parks_a_replayed_event_during_catch_up(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The catch-up path follows the same policy: an event of the store that always
    fails is parked to the Kafka parking topic after its attempts (its source names the
    store position), the replay goes on, and the partition goes live."""
    ns = f"bcu{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    app = App(
        f"{ns}app",
        kafka_bootstrap=kafka_bootstrap,
        data_dir=tmp_path / "data",
        web_port=0,
        event_store=url,
    )
    topic = app.topic(f"{ns}in", partitions=1)
    parking = f"{ns}in.parked"
    counts_table: Table[int] = Table("counts")
    calls: Counter[str] = Counter()
    policy = Redeliver(pause_s=0.2, max_attempts=2, fallback=Park(parking))

    @app.agent(topic, tables=[counts_table], on_failure=policy, history=FromEventStore())
    async def count(event: Event, counts: TableView[int]) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        counts[sid] = counts.get(sid, 0) + 1
        if event.type == "poison":
            raise ValueError(f"cannot apply {event.id}")

    store = await open_store(url)
    try:
        stored = [Event.create("e", stream_id="s", id=f"e{i}") for i in range(3)]
        stored += [Event.create("poison", stream_id="s", id="bad")]
        stored += [Event.create("e", stream_id="s", id=f"e{i}") for i in range(3, 6)]
        for event in stored:
            await store.append_many([Append("s", [event])])
    finally:
        await store.close()

    settings = app.settings()
    await create_app_topics(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        tasks = worker.source.assignment.tasks  # the group may assign after start returns
        await until(
            lambda: tasks and all(t.phase is Phase.LIVE for t in tasks.values()),
            what="every partition live",
            progress=lambda: repr([t.status() for t in tasks.values()]),
        )
        (task,) = tasks.values()
        assert task.phase is Phase.LIVE
        assert task.tables is not None
        assert task.tables.views[0].get("s") == 6  # every stored event but the poison
        assert calls["bad"] == 2
        assert all(n == 1 for eid, n in calls.items() if eid != "bad")
    finally:
        await worker.stop()

    (parked,) = await _read_all(kafka_bootstrap, parking, 1)
    headers = dict(parked.headers)
    assert (
        headers["streamapp-park-reason"]
        == b"gave up after 2 attempts: ValueError: cannot apply bad"
    )
    assert headers["streamapp-source"] == f"{topic.name}/0/4".encode()  # store position 4


async def _group_members(bootstrap: str, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
        (described,) = response.groups
        return len(described[5])  # (error, group, state, protocol type, protocol, members, ...)
    finally:
        await admin.close()


async def test_refuse_stops_the_worker_commits_nothing_for_it_and_leaves_the_group(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """An agent that raises Refuse stops its worker with that reason: the events before
    it are committed, it is not, and the consumer has left the group (no waiting for a
    session timeout), so the next worker (here: the fixed code) starts at that event."""
    ns = f"refuse{uuid.uuid4().hex[:6]}-"

    def build(refuses: bool) -> App:
        app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
        counts: Table[int] = Table("counts")

        @app.agent(app.topic(f"{ns}in", partitions=1), tables=[counts])
        async def count(event: Event, c: TableView[int]) -> None:
            if refuses and event.type == "v9":
                raise Refuse("schema v9 is unknown to this code; deploy the version that knows it")
            c["s"] = c.get("s", 0) + 1

        return app

    app = build(refuses=True)
    settings = app.settings()
    await create_app_topics(app, settings)
    kinds = ["v1", "v1", "v1", "v9", "v1", "v1"]
    events = [Event.create(k, stream_id="s", data={}) for k in kinds]
    await _send_raw(kafka_bootstrap, f"{ns}in", [codec.encode(e) for e in events])  # type: ignore[misc]

    worker = Worker(app, settings)
    await worker.start()
    try:
        with pytest.raises(AgentRefusedError) as refused:
            await finished(
                worker.source.wait(),
                what="the agent refused",
                progress=lambda: source_progress(worker.source),
            )
        assert f"agent 'count' refused {ns}in[0]@3" in str(refused.value)
        assert "deploy the version that knows it" in str(refused.value)
    finally:
        await worker.stop()
    assert await lag(kafka_bootstrap, app.id, f"{ns}in") == 3  # committed up to it, not it
    assert await _group_members(kafka_bootstrap, app.id) == 0  # left at once

    fixed = build(refuses=False)
    worker = Worker(fixed, fixed.settings())
    await worker.start()
    try:
        await _lag_gone(kafka_bootstrap, app.id, f"{ns}in")
        (task,) = worker.source.assignment.tasks.values()
        assert task.tables is not None
        assert task.tables.views[0].get("s") == 6  # each event once, the refused one too
    finally:
        await worker.stop()


async def _lag_gone(bootstrap: str, group: str, topic: str) -> None:
    """Until ``group`` committed all of ``topic``; fails once the lag stood still 60 s."""
    behind = [-1]

    async def committed() -> bool:
        behind[0] = await lag(bootstrap, group, topic)
        return behind[0] == 0

    await until(committed, what=f"{group} caught up on {topic}", progress=lambda: behind[0])
