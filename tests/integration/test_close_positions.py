"""On real RabbitMQ: a closed partition's log line names where the next start resumes it
(the checkpoint's event-store position, then the queue: RabbitMQ has no offsets), and
the next start does resume there."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.eventstore import open_store
from streamapp.transports.rabbitmq.topology import create_topology
from streamapp.worker import Worker
from tests.conftest import Services
from tests.support.waits import until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_rabbitmq_close_line_names_the_store_position_it_resumes_from(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamapp")
    ns = f"cl{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path}/e.db"
    store = await open_store(url)
    try:
        for i in range(1, 31):
            await store.append(f"s{i}", [Event.create("t", stream_id=f"s{i}", data={})])
    finally:
        await store.close()
    seen: list[str] = []
    app = App(f"{ns}app", broker="rabbitmq", amqp_url=services.amqp, event_store=url)
    counts: Table[int] = Table("counts")

    @app.agent(app.topic(f"{ns}in", partitions=2), tables=[counts], history=FromEventStore())
    async def count(event: Event, c: TableView[int]) -> None:
        seen.append(event.id)

    settings = app.settings(data_dir=tmp_path / "data", web_port=0)
    await create_topology(app, settings)

    async def run_once() -> list[str]:
        caplog.clear()
        worker = Worker(app, settings)
        await worker.start()
        try:
            await until(
                lambda: any(r.getMessage().startswith("owns 2") for r in caplog.records),
                what="the worker's summary (owns 2)",
                progress=lambda: len(caplog.records),
                poll_s=0.05,
            )
        finally:
            await worker.stop()
        return sorted(
            r.getMessage() for r in caplog.records if r.getMessage().startswith("closed ")
        )

    closed = await run_once()
    assert len(seen) == 30
    assert closed == [
        f"closed {ns}in[{p}]: resumes from event-store position 31, then the queue" for p in (0, 1)
    ]
    seen.clear()
    again = await run_once()
    assert seen == []  # it resumed at position 31: nothing replayed again
    assert again == closed
