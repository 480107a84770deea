"""A mistyped SQLite store path is refused instead of making an empty store elsewhere,
``?create=1`` makes the directories, and a starting worker logs its store and head."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streamapp import App, Event
from streamapp.errors import ConfigError
from streamapp.eventstore import open_store, parse_url
from streamapp.worker import Worker


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_missing_directory_is_refused_and_nothing_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        await open_store("sqlite:///nodir/x.db")
    message = str(refused.value)
    assert "STREAMAPP_EVENT_STORE" in message
    assert f"the directory {tmp_path / 'nodir'} of the SQLite store does not exist" in message
    assert "sqlite:///nodir/x.db?create=1" in message
    assert _entries(tmp_path) == []


async def test_create_makes_the_directory_and_names_the_same_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///nodir/x.db?create=1")
    try:
        await store.append("s-1", [Event.create("t", stream_id="s-1")])
    finally:
        await store.close()
    assert _entries(tmp_path / "nodir") == ["x.db"]
    assert parse_url("sqlite:///nodir/x.db?create=1") == parse_url("sqlite:///nodir/x.db")
    reopened = await open_store("sqlite:///nodir/x.db")  # exists now: no flag needed
    try:
        assert await reopened.head() == 1
    finally:
        await reopened.close()
    with pytest.raises(ConfigError, match=r"the only query is \?create=1"):
        parse_url("sqlite:///nodir/x.db?mode=ro")


async def test_a_worker_logs_its_store_and_head_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    store = await open_store(url)
    try:
        for i in range(3):
            await store.append(f"s-{i}", [Event.create("t", stream_id=f"s-{i}")])
    finally:
        await store.close()
    app = App("logs-store")

    @app.agent(app.topic("in", partitions=1))
    async def agent(event: Event) -> None:
        pass

    settings = app.settings(broker="none", event_store=url, web_port=0, data_dir=tmp_path)
    worker = Worker(app, settings)
    with caplog.at_level(logging.INFO, logger="streamapp"):
        await worker.start()
        await worker.stop()
    assert f"event store {url}: head position 3" in caplog.text
