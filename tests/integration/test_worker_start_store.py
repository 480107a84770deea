"""A worker whose topics are missing on the real broker stops before it opens the event
store: the start that failed leaves no store file."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.errors import MissingTopicError
from streamapp.worker import Worker
from tests.conftest import Services

pytestmark = pytest.mark.integration


def _app() -> App:
    app = App(f"nostore-{uuid.uuid4().hex[:8]}")
    table: Table[int] = Table("counts")

    @app.agent(app.topic(f"in-{uuid.uuid4().hex[:8]}", partitions=2), tables=[table],
               history=FromEventStore())  # fmt: skip
    async def count(event: Event, counts: TableView[int]) -> None: ...

    return app


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
async def test_missing_topics_leave_no_store_file(
    broker: str, tmp_path: Path, services: Services
) -> None:
    app = _app()
    settings = app.settings(
        broker=broker,
        kafka_bootstrap=services.kafka,
        amqp_url=services.amqp,
        event_store=f"sqlite:///{tmp_path}/streamapp-events.db",
        data_dir=tmp_path / "data",
        web_port=0,
    )
    with pytest.raises(MissingTopicError, match="topics create"):
        await Worker(app, settings).start()
    assert sorted(os.listdir(tmp_path)) == []
