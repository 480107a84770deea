"""``Refuse`` on real RabbitMQ, in a worker process: the source stops, the deliveries it
held go back to their queue flagged redelivered, the worker exits non-zero naming the
agent and the reason; the fixed code then applies every event once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import aio_pika
import pytest

from streamapp import Event
from streamapp.codecs import amqp as codec
from streamapp.settings.settings import Settings
from streamapp.transports.rabbitmq.sink import RabbitSink
from tests.conftest import Services
from tests.support.waits import run_watched, until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    read_table,
    streamapp_cmd,
    wait_ready,
    worker_progress,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.refuse_app:app"


async def _publish(amqp: str, topic: str, events: list[Event]) -> None:
    sink = RabbitSink(Settings(app_id="refuse-test", broker="rabbitmq", amqp_url=amqp), {topic: 1})
    await sink.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await sink.publish(topic, value, key=key, headers=headers)
    finally:
        await sink.stop()


async def _queued(amqp: str, queue: str) -> list[tuple[str, bool]]:
    """``(event type, redelivered)`` of every message in ``queue``, left in it."""
    connection = await aio_pika.connect(amqp)
    got: list[tuple[str, bool]] = []
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        while (message := await declared.get(fail=False, no_ack=False)) is not None:
            kind = (message.headers or {}).get("cloudEvents_type")
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            got.append((kind, bool(message.redelivered)))
    finally:
        await connection.close()  # unacked: back to the queue
    return got


async def test_refuse_stops_the_worker_non_zero_and_its_deliveries_come_back_flagged(
    services: Services, tmp_path: Path
) -> None:
    amqp = services.amqp
    ns = f"rrf{uuid.uuid4().hex[:6]}-"
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": amqp,
        "STREAMAPP_POLL_TIMEOUT_MS": "200",
        "STREAMAPP_EVENT_STORE": f"sqlite:///{tmp_path / 'events.db'}",
    }
    run = await asyncio.to_thread(
        run_watched,
        streamapp_cmd("topics", "create", "-A", APP),
        env=app_env("127.0.0.1:1", ns, **env),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    worker = WorkerProc(
        "127.0.0.1:1", ns, tmp_path / "data", tmp_path / "w1.log", app_ref=APP, extra_env=env
    ).start()
    await wait_ready(worker)
    kinds = ["v1", "v1", "v1", "v9", "v1", "v1"]
    events = [Event.create(k, stream_id="s", data={}, version=i + 1) for i, k in enumerate(kinds)]
    await _publish(amqp, f"{ns}rf-in", events)
    assert worker.proc is not None
    started = time.monotonic()
    proc = worker.proc
    await until(
        lambda: proc.poll() is not None,
        what="the refusing worker exiting",
        progress=worker.log_size,
        detail=lambda: worker.log_text()[-3000:],
    )
    code = proc.returncode
    took = time.monotonic() - started
    log = worker.log_text()
    print(f"worker exited {code} after {took:.1f}s")
    assert code != 0, log[-3000:]
    assert "agent 'count' refused" in log, log[-3000:]
    assert "deploy the version that knows it" in log
    queued = await _queued(amqp, f"{ns}rf-in.0")
    assert [k for k, _ in queued] == ["v9", "v1", "v1"], queued  # the first three acked
    assert queued[0][1], "the refused delivery came back without the redelivered flag"

    fixed = WorkerProc(
        "127.0.0.1:1",
        ns,
        tmp_path / "data",
        tmp_path / "w2.log",
        app_ref=APP,
        extra_env={**env, "STREAMAPP_TEST_REFUSE_FIXED": "1"},
    ).start()
    try:
        await wait_ready(fixed)
        table: dict[str, object] = {}

        async def counted() -> bool:
            table.clear()
            table.update(await read_table([fixed], "counts", ["s"]))
            return table == {"s": 6}

        await until(
            counted,
            what="the fixed worker counting all six events of stream s",
            progress=lambda: worker_progress([fixed]),
            poll_s=0.2,
            detail=lambda: (table, fixed.log_text()[-3000:]),
        )
    finally:
        assert fixed.stop() == 0, fixed.log_text()[-3000:]
