"""A worker that does not start leaves nothing behind: no event-store file is created
before the broker answers or while the views' port is taken, and a broker that never
answers ends in an error that names ``STREAMAPP_BROKER=none``."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from streamapp import App, Backoff, Event, FromEventStore, Table, TableView
from streamapp.errors import BrokerUnavailableError, ConfigError
from streamapp.worker import Worker


def _left(directory: Path) -> list[str]:
    """What a start left in ``directory``."""
    return sorted(os.listdir(directory))


def _app() -> App:
    app = App("firsthour")
    table: Table[int] = Table("counts")

    @app.agent(app.topic("in", partitions=2), tables=[table], history=FromEventStore())
    async def count(event: Event, counts: TableView[int]) -> None: ...

    return app


async def test_no_kafka_names_broker_none_and_creates_no_store(tmp_path: Path) -> None:
    app = _app()
    db = tmp_path / "streamapp-events.db"
    settings = app.settings(
        kafka_bootstrap="127.0.0.1:1",
        startup_retry=Backoff(attempts=2, initial_s=0.01, max_s=0.02),
        event_store=f"sqlite:///{db}",
        data_dir=tmp_path / "data",
        web_port=0,
    )
    with pytest.raises(BrokerUnavailableError) as info:
        await Worker(app, settings).start()
    message = str(info.value)
    assert "kafka_bootstrap" in message
    assert "STREAMAPP_BROKER=none" in message
    assert "event store alone" in message
    assert _left(tmp_path) == [], "a failed start left files behind"


@pytest.mark.parametrize("broker", ["none", "kafka"])
async def test_a_taken_port_creates_no_store(tmp_path: Path, broker: str) -> None:
    app = _app()
    db = tmp_path / "streamapp-events.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = app.settings(
            broker=broker,
            kafka_bootstrap="127.0.0.1:1",
            event_store=f"sqlite:///{db}",
            data_dir=tmp_path / "data",
            web_port=port,
        )
        with pytest.raises(ConfigError, match=rf"127.0.0.1:{port}.*--web-port"):
            await Worker(app, settings).start()
    assert _left(tmp_path) == []


async def test_a_started_worker_serves_on_the_port_it_bound(tmp_path: Path) -> None:
    import aiohttp

    app = _app()
    settings = app.settings(
        broker="none",
        event_store=f"sqlite:///{tmp_path}/e.db",
        data_dir=tmp_path / "data",
        web_port=0,
    )
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.web_port
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{worker.web_port}/healthz") as answer,
        ):
            assert answer.status == 200
    finally:
        await worker.stop()
    assert (tmp_path / "e.db").exists()
