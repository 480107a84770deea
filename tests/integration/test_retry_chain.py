"""The retry chain on real Kafka, where it is Kafka's own: the relay's metrics and status
while it holds a copy, and ``kill -9`` between the retry copy and the commit. The
chain's shared behaviour (hops, back-offs, headers, dead letters) is the contract
suite, ``tests/contract/test_chain_contract.py``."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer

from streamapp import App, Event, Retry
from streamapp.codecs import kafka as codec
from streamapp.topics import partition_for
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
from tests.support import crashpoint
from tests.support.waits import until

from .harness import (
    WorkerProc,
    create_topics,
    lag,
    read_table,
    read_topic,
    wait_ready,
    worker_progress,
)

pytestmark = pytest.mark.integration

RETRY_APP = "tests.apps.retry_app:app"


async def _send(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


def _h(record: Any) -> dict[str, bytes]:
    return dict(record.headers)


def _app(ns: str, tmp_path: Path, bootstrap: str, policy: Retry) -> tuple[App, Any]:
    app = App(f"{ns}app", kafka_bootstrap=bootstrap, data_dir=tmp_path, web_port=0)
    return app, app.topic(f"{ns}in", partitions=2)


async def test_the_relay_reports_the_copy_it_holds_and_the_chain_on_status(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Kafka's side of the chain (its shared behaviour is the contract suite,
    ``tests/contract/test_chain_contract.py``): the relay's held copies and lag while a
    copy waits its back-off, then the hop histograms and ``/status``."""
    ns = f"dlq{uuid.uuid4().hex[:6]}-"
    policy = Retry(intervals=(0.1, 0.2), max_reconsume=4, backoff=(2,))
    app, topic = _app(ns, tmp_path, kafka_bootstrap, policy)
    attempts: Counter[str] = Counter()

    @app.agent(topic, on_failure=policy)
    async def picky(event: Event) -> None:
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
        retry_lag = f'streamapp_relay_lag{{partition="{p}",topic="{topic.name}-retry"}}'

        async def waiting() -> bool:  # the copy waits its 2 s back-off in the relay
            text = worker.metrics.render().decode()
            held = 'streamapp_relay_held_copies{relay="kafka"} 1.0' in text
            lag = [line for line in text.splitlines() if line.startswith(retry_lag)]
            return held and bool(lag) and float(lag[0].split()[-1]) >= 1  # copy + marker

        def moved() -> tuple[object, ...]:  # the handler's tries, the relay's gauges
            text = worker.metrics.render().decode().splitlines()
            relay = [line for line in text if line.startswith("streamapp_relay")]
            return attempts.total(), tuple(relay)

        await until(
            waiting, what="the relay holding the retry copy (held 1, lag >= 1)", progress=moved
        )

        async def dead() -> bool:
            return bool(await read_topic(kafka_bootstrap, f"{topic.name}-dlq"))

        await until(dead, what=lambda: f"dead-lettered (attempts {attempts})", progress=moved)
        assert attempts["poison"] == 5  # max_reconsume + 1
        metrics = worker.metrics.render().decode()
        assert 'streamapp_dead_lettered_total{agent="picky"} 1.0' in metrics
        assert 'streamapp_retried_total{agent="picky"} 1.0' in metrics
        assert 'streamapp_consumed_total{agent="picky"}' in metrics
        for kind in ("retried", "dead_lettered"):  # both copies carry x-retry-hop 1
            labels = f'agent="picky",kind="{kind}"'
            assert f'streamapp_retry_hop_bucket{{{labels},le="1.0"}} 1.0' in metrics
            assert f"streamapp_retry_hop_count{{{labels}}} 1.0" in metrics
        assert 'streamapp_relay_held_copies{relay="kafka"} 0.0' in metrics
        assert f"{retry_lag} 0.0" in metrics  # republished and committed
        url = f"http://127.0.0.1:{worker.web_port}/status"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            status = await response.json()
        assert status["retry_hops"] == {"picky": {"retried": {"1": 1}, "dead_lettered": {"1": 1}}}
        assert status["relays"] == [
            {
                "kind": "kafka",
                "held_copies": 0,
                "lag": {f"{topic.name}-retry/{q}": 0 for q in (0, 1)},
            }
        ]
        assert status["sinks"] == {}  # every publish confirmed
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
    crash = {
        **env,
        crashpoint.AT: "before_commit",
        crashpoint.TOPIC: f"{ns}rt-in-retry",  # the first transaction with a retry copy
    }
    events = [
        Event.create("add", stream_id=f"s{i % 4}", data={"n": 1}, version=i // 4 + 1)
        for i in range(20)
    ]
    events.insert(5, Event.create("gated", stream_id="g", data={"n": 100}, id="gated", version=1))
    first = WorkerProc(
        kafka_bootstrap,
        ns,
        tmp_path / "d",
        tmp_path / "w1.log",
        app_ref=RETRY_APP,
        extra_env=crash,
        launcher="tests.support.crashpoint",
    ).start()
    await wait_ready(first)
    await _send(kafka_bootstrap, f"{ns}rt-in", events)
    assert first.proc is not None
    await until(
        lambda: first.proc is not None and first.proc.poll() is not None,
        what="the first worker killed at its crash point",
        progress=first.log_size,
    )
    assert first.proc.returncode == -9, first.log_text()[-3000:]
    aborted = await read_topic(kafka_bootstrap, f"{ns}rt-in-retry", committed=False)
    assert [_h(r)["ce_id"] for r in aborted] == [b"gated"]  # the copy reached the broker
    assert not await read_topic(kafka_bootstrap, f"{ns}rt-in-retry")  # ... and was aborted

    second = WorkerProc(
        kafka_bootstrap, ns, tmp_path / "d", tmp_path / "w2.log", app_ref=RETRY_APP, extra_env=env
    ).start()
    try:
        await wait_ready(second)

        async def copied() -> bool:
            return bool(await read_topic(kafka_bootstrap, f"{ns}rt-in-retry"))

        await until(
            copied,
            what="the record came again and was copied once more",
            progress=lambda: worker_progress([second]),
        )
        gate.unlink()  # the next round trip succeeds
        expected = {f"s{i}": 5 for i in range(4)} | {"g": 100}

        async def done() -> bool:
            table = await read_table([second], "sums", list(expected))
            return table == expected

        await until(
            done, what="every event applied once", progress=lambda: worker_progress([second])
        )

        async def at_rest() -> bool:  # nothing left that could apply an event again
            status = await second.status()
            relays = (status or {}).get("relays") or []
            behind = [r for r in relays if r["held_copies"] or any(r["lag"].values())]
            return (
                bool(relays)
                and not behind
                and await lag(kafka_bootstrap, f"{ns}rt", f"{ns}rt-in") == 0
            )

        await until(
            at_rest,
            progress=lambda: worker_progress([second]),
            what="the worker at rest: its relay holds no retry copy and is not behind, and "
            f"group {ns}rt committed every record of {ns}rt-in",
        )
        assert await read_table([second], "sums", list(expected)) == expected
        copies = await read_topic(kafka_bootstrap, f"{ns}rt-in-retry")
        # 2: the aborted copy left no trace (one or more round trips, as the gate opened).
        assert [_h(c)["x-reconsume"] for c in copies][:1] == [b"2"]
        assert {_h(c)["ce_id"] for c in copies} == {b"gated"}
        assert not await read_topic(kafka_bootstrap, f"{ns}rt-in-dlq")
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]
