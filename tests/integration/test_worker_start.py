"""Worker start-up on a real broker: what is missing is named, never auto-created."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.eventstore import open_store
from streamapp.transports.base import transports
from streamapp.worker import Worker

from .harness import WorkerProc

pytestmark = pytest.mark.integration


async def test_missing_topics_are_named_and_not_created(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"missing{uuid.uuid4().hex[:6]}-"
    worker = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    code = worker.wait_exit()
    out = worker.log_text()
    assert code != 0
    assert f"{ns}orders" in out
    assert f"{ns}orders-project_order_status-changelog" in out
    assert "streamapp topics create -A agents.orders:app" in out
    assert "Traceback" not in out  # a clear message, not a stack trace
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        assert not [t for t in await admin.list_topics() if t.startswith(ns)]
    finally:
        await admin.close()


async def test_a_first_start_logs_one_summary_not_lines_per_partition(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka, a new app whose agent has a history: the partitions' catch-up and their
    first live offsets are DEBUG lines; INFO says it once, in the summary."""
    caplog.set_level(logging.INFO, logger="streamapp")
    app = App(f"firststart{uuid.uuid4().hex[:6]}")
    counts: Table[int] = Table("counts")

    @app.agent(app.topic(f"{app.id}-in", partitions=3), tables=[counts], history=FromEventStore())
    async def count(event: Event, c: TableView[int]) -> None:
        pass

    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = await open_store(url)
    try:
        for i in range(6):
            await store.append(f"s-{i}", [Event.create("t", stream_id=f"s-{i}", data={})])
    finally:
        await store.close()
    settings = app.settings(
        kafka_bootstrap=kafka_bootstrap, event_store=url, web_port=0, data_dir=tmp_path / "d"
    )
    await transports["kafka"].create_topology(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        last, moved = "", asyncio.get_running_loop().time()
        while not any(m.startswith("owns 3 partitions") for m in _info(caplog)):
            said = "\n".join(_info(caplog))
            if said != last:
                last, moved = said, asyncio.get_running_loop().time()
            assert asyncio.get_running_loop().time() - moved < 30, f"no summary yet:\n{said}"
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()
    started = _info(caplog)
    started = started[: next(i for i, m in enumerate(started) if " stopping: " in m)]
    per_partition = [m for m in started if f"{app.id}-in[" in m and not m.startswith("owns ")]
    assert per_partition == [], per_partition
    assert "owns 3 partitions: " + f"{app.id}-in[0-2] (agent count); live 3" in started


def _info(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
