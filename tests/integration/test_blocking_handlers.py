"""Handlers that block (``time.sleep``) on a real Kafka worker: without ``blocking=True``
the stall watchdog names the agent and the record; with it, the other partition, the
views and ``/healthz`` go on during the sleeps, per-partition order and state stay exact,
and the group does not rebalance."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import App, Event, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.topics import partition_for
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
from tests.support.waits import until

from .test_failure_policies import _send_raw

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLEEP_S = 1.5


def _stream_in(partition: int, prefix: str) -> str:
    return next(
        f"{prefix}{i}"
        for i in range(1000)
        if partition_for(f"{prefix}{i}".encode(), 2) == partition
    )


async def _send(bootstrap: str, topic: str, events: list[Event]) -> None:
    await _send_raw(bootstrap, topic, [codec.encode(e) for e in events])  # type: ignore[misc]


def _moved(worker: Worker, caplog: pytest.LogCaptureFixture) -> Callable[[], object]:
    """A wait's progress over an in-process worker: its log records, its partitions'
    phases and events processed."""

    def moved() -> object:
        tasks = worker.source.assignment.tasks.items()
        parts = sorted((p, t.phase.name, t.counts.processed) for (_, p), t in tasks)
        return len(caplog.records), tuple(parts)

    return moved


async def _get(port: int, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=30)) as r,
    ):
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, await r.text()


def _settings(app: App, bootstrap: str, data_dir: Path) -> Any:
    return app.settings(
        kafka_bootstrap=bootstrap,
        data_dir=data_dir,
        web_port=0,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        loop_stall_warn_ms=300,
    )


async def test_a_handler_blocking_the_loop_is_named_by_the_stall_warning(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamapp.stall")
    ns = f"stall{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app")
    topic = app.topic(f"{ns}in", partitions=2)
    applied: Table[list[int]] = Table("applied")

    @app.agent(topic, tables=[applied])
    async def apply(event: Event, view: TableView[list[int]]) -> None:
        sid = event.stream_id
        assert sid is not None
        if event.type == "slow":
            time.sleep(SLEEP_S)  # noqa: ASYNC251  # blocks the event loop: what is warned of
        view[sid] = [*view.get(sid, []), int(event.extensions["streamversion"])]

    settings = _settings(app, kafka_bootstrap, tmp_path)
    await create_app_topics(app, settings)
    sid = _stream_in(0, "s")
    await _send(
        kafka_bootstrap,
        topic.name,
        [
            Event.create("fast", stream_id=sid, version=1),
            Event.create("slow", stream_id=sid, version=2, id="the-slow-one"),
            Event.create("fast", stream_id=sid, version=3),
        ],
    )
    worker = Worker(app, settings)
    await worker.start()
    try:

        def ended() -> bool:
            return any("was blocked for" in r.getMessage() for r in caplog.records)

        await until(ended, what="the stall's end is logged", progress=_moved(worker, caplog))
        assert worker.web_port is not None
        _, status = await _get(worker.web_port, "/status")
        _, metrics = await _get(worker.web_port, "/metrics")
    finally:
        await worker.stop()
    during = [r.getMessage() for r in caplog.records if "so far by agent 'apply'" in r.getMessage()]
    assert len(during) == 1, caplog.text
    assert (
        f"handling {topic.name}[0]@1 (stream {sid}, version 2, type slow, id the-slow-one)"
        in (during[0])
    )
    assert "in apply" in during[0]  # the handler's line that blocks
    total = next(r.getMessage() for r in caplog.records if "was blocked for" in r.getMessage())
    assert "agent 'apply'" in total
    assert "blocking=True" in total
    last = status["last_loop_stall"]
    assert last["agent"] == "apply"
    assert last["record"].startswith(f"{topic.name}[0]@1 ")
    assert last["seconds"] >= SLEEP_S - 0.2
    assert 'streamapp_loop_stalls_total{agent="apply"} 1.0' in metrics
    assert "streamapp_loop_stall_seconds_count 1.0" in metrics


async def test_a_blocking_agent_leaves_other_partitions_views_and_heartbeats_running(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamapp.stall")
    ns = f"blocking{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app")
    topic = app.topic(f"{ns}in", partitions=2)
    applied: Table[list[int]] = Table("applied")
    holding = threading.Event()
    release = threading.Event()
    returned = threading.Event()
    order: list[tuple[str, int]] = []

    @app.agent(topic, tables=[applied], blocking=True)
    def apply(event: Event, view: TableView[list[int]]) -> None:
        sid = event.stream_id
        assert sid is not None
        version = int(event.extensions["streamversion"])
        if event.type == "hold":  # time.sleep(1.5), again, until the test has seen enough
            holding.set()
            for _ in range(40):
                time.sleep(SLEEP_S)
                if release.is_set():
                    break
            returned.set()
        elif event.type == "slow":
            time.sleep(SLEEP_S)
        order.append((sid, version))
        view[sid] = [*view.get(sid, []), version]

    settings = _settings(app, kafka_bootstrap, tmp_path)
    await create_app_topics(app, settings)
    slow, fast = _stream_in(0, "slow"), _stream_in(1, "fast")
    kinds = ["fast", "hold", "slow", "fast", "slow", "fast"]
    await _send(
        kafka_bootstrap,
        topic.name,
        [Event.create(k, stream_id=slow, version=v) for v, k in enumerate(kinds, 1)],
    )
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.web_port is not None
        port = worker.web_port
        await until(
            holding.is_set,
            what="the slow partition's handler sleeps",
            progress=_moved(worker, caplog),
        )
        generation = worker.source.generation  # type: ignore[attr-defined]
        tasks = dict(worker.source.assignment.tasks)
        assert generation is not None
        await _send(
            kafka_bootstrap,
            topic.name,
            [Event.create("fast", stream_id=fast, version=v) for v in range(1, 21)],
        )

        async def fast_applied() -> bool:
            code, body = await _get(port, f"/tables/applied/{fast}")
            return code == 200 and body == list(range(1, 21))

        await until(
            fast_applied,
            what="the other partition's 20 events, read through a view",
            progress=_moved(worker, caplog),
        )
        code, health = await _get(port, "/healthz")
        assert code == 200
        assert health["status"] == "ok"
        assert not returned.is_set()  # all of it while the handler still slept
        release.set()

        async def slow_applied() -> bool:
            code, body = await _get(port, f"/tables/applied/{slow}")
            return code == 200 and body == list(range(1, len(kinds) + 1))

        await until(
            slow_applied,
            what="the slow partition's events, in order",
            progress=_moved(worker, caplog),
        )
        assert worker.source.generation == generation  # type: ignore[attr-defined]
        assert dict(worker.source.assignment.tasks) == tasks  # no rebalance, same tasks
        _, metrics = await _get(port, "/metrics")
    finally:
        release.set()
        await worker.stop()
    assert [v for s, v in order if s == slow] == list(range(1, len(kinds) + 1))
    assert [v for s, v in order if s == fast] == list(range(1, 21))
    first_fast = order.index((fast, 1))
    assert first_fast < order.index((slow, 2))  # handled during the hold
    stalls = [r.getMessage() for r in caplog.records if "agent 'apply'" in r.getMessage()]
    assert stalls == []  # the sleeps never blocked the event loop
    assert 'streamapp_loop_stalls_total{agent="apply"}' not in metrics


async def test_a_stop_waits_for_a_blocking_call_up_to_its_budget_then_drops_the_batch(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamapp")
    ns = f"blockstop{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app")
    topic = app.topic(f"{ns}in", partitions=2)
    applied: Table[list[int]] = Table("applied")
    holding = threading.Event()
    release = threading.Event()
    held: list[int] = []

    @app.agent(topic, tables=[applied], blocking=True)
    def apply(event: Event, view: TableView[list[int]]) -> None:
        sid = event.stream_id
        assert sid is not None
        version = int(event.extensions["streamversion"])
        if event.type == "hold" and not held:  # the first attempt outlives the stop's budget
            held.append(version)
            holding.set()
            release.wait(60)
        view[sid] = [*view.get(sid, []), version]

    def settings() -> Any:
        return _settings(app, kafka_bootstrap, tmp_path).with_(
            rebalance_timeout_ms=4000, batch_budget_ms=2000, shutdown_timeout_s=20
        )

    await create_app_topics(app, settings())
    sid = _stream_in(0, "s")
    kinds = ["fast", "hold", "fast"]
    await _send(
        kafka_bootstrap,
        topic.name,
        [Event.create(k, stream_id=sid, version=v) for v, k in enumerate(kinds, 1)],
    )
    first = Worker(app, settings())
    await first.start()
    try:
        await until(holding.is_set, what="the handler holds", progress=_moved(first, caplog))
    finally:
        await first.stop()  # returns: the budget (2 s) ran out, the batch was dropped
    assert not release.is_set()
    told = [r.getMessage() for r in caplog.records if "did not return within" in r.getMessage()]
    assert len(told) == 1, caplog.text
    assert "agent 'apply'" in told[0]
    release.set()  # the abandoned call ends now: its writes were never committed
    second = Worker(app, settings())
    await second.start()
    try:
        assert second.web_port is not None
        port = second.web_port

        async def applied_once() -> bool:
            code, body = await _get(port, f"/tables/applied/{sid}")
            return code == 200 and body == [1, 2, 3]

        await until(
            applied_once,
            what="every event applied once, after the restart",
            progress=_moved(second, caplog),
        )
    finally:
        await second.stop()
    assert held == [2]
