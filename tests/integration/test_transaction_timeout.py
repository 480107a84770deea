"""On real Kafka the partition task's transaction is bounded by ``transaction_timeout_s``,
not by ``publish_timeout_s``: with a publish deadline far below what a transaction takes,
a table agent still commits; with a transaction deadline that small, the transaction
fails naming ``transaction_timeout_s`` and nothing is committed."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from pathlib import Path

import pytest

from streamapp import App, Event, Table, TableView
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
from tests.support.waits import until

from .harness import produce

pytestmark = pytest.mark.integration


def _app(
    ns: str, tmp_path: Path, bootstrap: str, **timeouts: float
) -> tuple[App, str, Counter[str]]:
    app = App(f"{ns}app", kafka_bootstrap=bootstrap, data_dir=tmp_path, web_port=0, **timeouts)
    topic = app.topic(f"{ns}in", partitions=1)
    sums: Table[int] = Table("sums")
    seen: Counter[str] = Counter()

    @app.agent(topic, tables=[sums])
    async def summer(event: Event, view: TableView[int]) -> None:
        seen[event.id] += 1
        view["s"] = view.get("s", 0) + 1

    return app, topic.name, seen


async def test_a_tiny_publish_timeout_does_not_bound_the_transaction(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"txp{uuid.uuid4().hex[:6]}-"
    app, topic, _seen = _app(ns, tmp_path, kafka_bootstrap, publish_timeout_s=0.001)
    await create_app_topics(app, app.settings())
    worker = Worker(app, app.settings())
    await worker.start()
    try:
        await produce(
            kafka_bootstrap, topic, [Event.create("t", stream_id="s", id=f"e{i}") for i in range(3)]
        )

        def committed() -> bool:
            tasks = list(worker.source.assignment.tasks.values())
            return any(t.tables is not None and t.tables.views[0].get("s") == 3 for t in tasks)

        await until(
            committed,
            what="3 committed",
            progress=lambda: repr([t.status() for t in worker.source.assignment.tasks.values()]),
            stalled_s=30,
        )
    finally:
        await worker.stop()


async def test_the_transaction_fails_past_transaction_timeout_s(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = f"txt{uuid.uuid4().hex[:6]}-"
    app, topic, _seen = _app(ns, tmp_path, kafka_bootstrap, transaction_timeout_s=0.001)
    await create_app_topics(app, app.settings())
    worker = Worker(app, app.settings())
    try:
        await worker.start()
        await produce(kafka_bootstrap, topic, [Event.create("t", stream_id="s", id="e")])
        await until(
            lambda: any(
                "(setting transaction_timeout_s)" in r.getMessage()
                for r in caplog.records
                if r.levelno >= logging.WARNING
            ),
            what="a failure naming transaction_timeout_s",
            progress=lambda: len(caplog.records),
            stalled_s=30,
        )
    finally:
        await worker.stop()
