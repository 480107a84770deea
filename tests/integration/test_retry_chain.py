"""The retry chain on real Kafka: a record that fails, then succeeds through the retry
topic (headers asserted on the topics), a poison record dead-lettered without holding
its partition, and ``kill -9`` between the retry copy and the commit."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamapp import App, Event, Retry, Table, TableView
from streamapp.kafka import codec
from streamapp.kafka.topics import create_topics as create_app_topics
from streamapp.partitioner import partition_for
from streamapp.worker import Worker

from .harness import WorkerProc, create_topics, read_table, wait_ready

pytestmark = pytest.mark.integration

RETRY_APP = "tests.integration.retry_app:app"


async def _send(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str, *, committed: bool = True) -> list[Any]:
    """Every record of ``topic`` now (``read_committed`` unless ``committed`` is False)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    await consumer.start()
    got: list[Any] = []
    try:
        for _ in range(4):
            batch = await consumer.getmany(timeout_ms=500)
            got += [r for recs in batch.values() for r in recs]
    finally:
        await consumer.stop()
    return sorted(got, key=lambda r: (r.partition, r.offset))


def _h(record: Any) -> dict[str, bytes]:
    return dict(record.headers)


async def _until(check: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def _app(ns: str, tmp_path: Path, bootstrap: str, policy: Retry) -> tuple[App, Any]:
    app = App(f"{ns}app", kafka_bootstrap=bootstrap, data_dir=tmp_path, web_port=0)
    return app, app.topic(f"{ns}in", partitions=2)


async def test_fails_five_times_then_succeeds_through_the_retry_topic(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"retry{uuid.uuid4().hex[:6]}-"
    policy = Retry(intervals=(0.1, 0.5), backoff=(1,))
    app, topic = _app(ns, tmp_path, kafka_bootstrap, policy)
    sums: Table[int] = Table("sums")
    calls: Counter[str] = Counter()

    @app.agent(topic, tables=[sums], on_failure=policy)
    async def summer(event: Event, view: TableView[int]) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        if event.id == "flaky" and calls[event.id] <= 5:
            raise RuntimeError(f"failure {calls[event.id]}")  # after the write: rolled back

    settings = app.settings()
    await create_app_topics(app, settings)
    flaky = Event.create("add", stream_id="s", data={"n": 7}, id="flaky", version=1)
    worker = Worker(app, settings)
    await worker.start()
    try:
        started_ms = time.time() * 1000
        await _send(kafka_bootstrap, topic.name, [flaky])

        async def applied() -> bool:
            return await _value(worker, "sums", "s") == 7 and calls["flaky"] == 6

        await _until(applied, 30, f"applied once after 5 failures (calls {calls})")
        await asyncio.sleep(1.0)  # nothing more comes
        assert calls["flaky"] == 6
        assert await _value(worker, "sums", "s") == 7  # as if it ran once
        (copy,) = await _read(kafka_bootstrap, f"{topic.name}-retry")
        h = _h(copy)
        assert h["x-reconsume"] == b"3"  # the first delivery and two inline retries
        assert h["x-retry-hop"] == b"1"
        assert h["x-origin-topic"] == topic.name.encode()
        assert started_ms + 1000 <= int(h["x-deliver-at"]) <= time.time() * 1000
        assert h["ce_id"] == b"flaky"  # the CloudEvent's headers kept
        assert copy.key == b"s"
        records = await _read(kafka_bootstrap, topic.name)
        first, back = records
        assert _h(back)["x-reconsume"] == b"3"
        assert _h(back)["x-retry-hop"] == b"1"
        assert "x-deliver-at" not in _h(back)
        assert "x-origin-topic" not in _h(back)
        assert back.value == first.value
        assert back.partition == first.partition
        assert {k: v for k, v in _h(back).items() if not k.startswith("x-")} == _h(first)
        assert not await _read(kafka_bootstrap, f"{topic.name}-dlq")
        metrics = worker.metrics.render().decode()
        assert 'streamapp_retried_total{agent="summer"} 1.0' in metrics
        assert 'streamapp_failed_attempts_total{agent="summer"} 5.0' in metrics
        assert 'streamapp_dead_lettered_total{agent="summer"}' not in metrics
    finally:
        await worker.stop()


async def test_a_poison_record_is_dead_lettered_and_does_not_hold_its_partition(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"dlq{uuid.uuid4().hex[:6]}-"
    policy = Retry(intervals=(0.1, 0.2), max_reconsume=4, backoff=(2,))
    app, topic = _app(ns, tmp_path, kafka_bootstrap, policy)
    seen: dict[str, float] = {}
    attempts: Counter[str] = Counter()

    @app.agent(topic, on_failure=policy)
    async def picky(event: Event) -> None:
        seen.setdefault(event.id, time.monotonic())
        if event.type == "poison":
            attempts[event.id] += 1
            raise ValueError("cannot digest")

    settings = app.settings()
    await create_app_topics(app, settings)
    key = "k0"
    p = partition_for(key.encode(), 2)
    poison = Event.create("poison", stream_id=key, data={}, id="poison")
    after = [Event.create("ok", stream_id=key, data={}, id=f"ok{i}") for i in range(3)]
    worker = Worker(app, settings)
    await worker.start()
    try:
        await _send(kafka_bootstrap, topic.name, [poison, *after])

        async def dead() -> bool:
            return bool(await _read(kafka_bootstrap, f"{topic.name}-dlq"))

        await _until(dead, 40, f"dead-lettered (attempts {attempts})")
        assert attempts["poison"] == 5  # max_reconsume + 1
        held = seen["ok0"] - seen["poison"]
        assert held < 1.5, f"the next record waited {held:.2f}s (inline budget 0.3 s)"
        (dlq,) = await _read(kafka_bootstrap, f"{topic.name}-dlq")
        h = _h(dlq)
        assert h["x-reconsume"] == b"5"
        assert h["x-retry-hop"] == b"1"
        assert h["x-origin-topic"] == topic.name.encode()
        assert h["x-dlq-reason"] == b"failed 5 times: ValueError: cannot digest"
        assert h["x-origin"].startswith(f"{topic.name}/{p}/".encode())
        assert h["x-retry-agent"] == b"picky"
        assert h["ce_id"] == b"poison"
        (retried,) = await _read(kafka_bootstrap, f"{topic.name}-retry")
        assert _h(retried)["x-reconsume"] == b"3"
        metrics = worker.metrics.render().decode()
        assert 'streamapp_dead_lettered_total{agent="picky"} 1.0' in metrics
        assert 'streamapp_retried_total{agent="picky"} 1.0' in metrics
        assert 'streamapp_consumed_total{agent="picky"}' in metrics
    finally:
        await worker.stop()


@pytest.mark.slow
async def test_kill_9_between_the_retry_copy_and_the_commit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The first worker kills itself (SIGKILL) inside the transaction that holds the retry
    copy and the offset, after the copy reached the broker: the copy is aborted, the
    record comes again to the next worker, and every event is applied once."""
    ns = f"rtkill{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, RETRY_APP)
    gate = tmp_path / "gate"
    gate.touch()
    env = {"STREAMAPP_TEST_RETRY_GATE": str(gate)}
    crash = {**env, "STREAMAPP_TEST_CRASH_BEFORE_COMMIT": f"{ns}rt-in-retry"}
    events = [
        Event.create("add", stream_id=f"s{i % 4}", data={"n": 1}, version=i // 4 + 1)
        for i in range(20)
    ]
    events.insert(5, Event.create("gated", stream_id="g", data={"n": 100}, id="gated", version=1))
    first = WorkerProc(
        kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w1.log", app_ref=RETRY_APP, extra_env=crash
    ).start()
    await wait_ready(first)
    await _send(kafka_bootstrap, f"{ns}rt-in", events)
    assert first.proc is not None
    await asyncio.to_thread(first.proc.wait, 60)
    assert first.proc.returncode == -9, first.log_text()[-3000:]
    aborted = await _read(kafka_bootstrap, f"{ns}rt-in-retry", committed=False)
    assert [_h(r)["ce_id"] for r in aborted] == [b"gated"]  # the copy reached the broker
    assert not await _read(kafka_bootstrap, f"{ns}rt-in-retry")  # ... and was aborted

    second = WorkerProc(
        kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w2.log", app_ref=RETRY_APP, extra_env=env
    ).start()
    try:
        await wait_ready(second)

        async def copied() -> bool:
            return bool(await _read(kafka_bootstrap, f"{ns}rt-in-retry"))

        await _until(copied, 30, "the record came again and was copied once more")
        gate.unlink()  # the next round trip succeeds
        expected = {f"s{i}": 5 for i in range(4)} | {"g": 100}

        async def done() -> bool:
            table = await read_table([second], "sums", list(expected))
            return table == expected

        await _until(done, 30, "every event applied once")
        await asyncio.sleep(1.5)
        assert await read_table([second], "sums", list(expected)) == expected
        copies = await _read(kafka_bootstrap, f"{ns}rt-in-retry")
        # 2: the aborted copy left no trace (one or more round trips, as the gate opened).
        assert [_h(c)["x-reconsume"] for c in copies][:1] == [b"2"]
        assert {_h(c)["ce_id"] for c in copies} == {b"gated"}
        assert not await _read(kafka_bootstrap, f"{ns}rt-in-dlq")
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]


async def _value(worker: Worker, table: str, key: str) -> Any:
    """The key's committed value from the worker's view (None: absent or not served)."""
    url = f"http://127.0.0.1:{worker.web_port}/tables/{table}/{key}"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return await r.json() if r.status == 200 else None
