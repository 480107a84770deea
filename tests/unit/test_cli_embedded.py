"""The commands a new user runs beside an embedded worker (``STREAMAPP_BROKER=none``, a
real SQLite store, the worker in this process): ``tables``, ``tables get|scan`` find the
running worker from the store's ledger, ``tables -A`` lists the app's tables offline when
no worker answers, ``topics create`` has nothing to create, and the worker's close line,
``/status``, lock file and first lines say what is true."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from click.testing import CliRunner, Result

from streamapp import App, ConfigError, Event, FromEventStore, Table, TableView
from streamapp.cli import main
from streamapp.eventstore import open_store
from streamapp.worker import Worker
from tests.integration.harness import free_port

PROJECTION = """
from streamapp import App, Event, Table, TableView

app = App("{app_id}")
counts: Table[int] = Table("counts", version=2)

@app.agent(app.topic("in", partitions=4), tables=[counts])  # no history=
async def count(event: Event, c: TableView[int]) -> None:
    assert event.stream_id is not None
    c[event.stream_id] = (c.get(event.stream_id) or 0) + 1
"""
EVENTS = 300
STREAMS = 10


@pytest.fixture
def projection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[tuple[str, App]]:
    """``(module:app, the App)`` of a projection module written to ``tmp_path``."""
    name = f"embedded_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PROJECTION.format(app_id=name.replace("_", "-")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        yield f"{name}:app", module.app
    finally:
        sys.modules.pop(name, None)


def _env(url: str, **more: str) -> dict[str, str]:
    # web_port names a port nothing serves: the CLI must find the worker elsewhere
    return {
        "STREAMAPP_BROKER": "none",
        "STREAMAPP_EVENT_STORE": url,
        "STREAMAPP_WEB_PORT": str(free_port()),
        "STREAMAPP_WEB_TOKEN": "",
        **more,
    }


async def _cli(args: list[str], env: dict[str, str]) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, args, env=env)


async def _append(url: str, n: int) -> None:
    store = await open_store(url)
    try:
        for i in range(n):
            stream = f"s-{i % STREAMS}"
            await store.append(stream, [Event.create("t", stream_id=stream, data={}, id=f"e{i}")])
    finally:
        await store.close()


async def _status(worker: Worker) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{worker.web_port}/status") as r,
    ):
        body: dict[str, Any] = await r.json()
        return body


async def _wait(progress: Callable[[], Any], done: Callable[[Any], bool], what: str) -> Any:
    """Poll ``progress()`` until ``done``; fail when it stops changing for 15 s."""
    loop = asyncio.get_running_loop()
    last, moved = None, loop.time()
    while True:
        now = await progress()
        if done(now):
            return now
        if now != last:
            last, moved = now, loop.time()
        elif loop.time() - moved > 15:
            raise AssertionError(f"no progress towards {what} for 15 s: {now!r}")
        await asyncio.sleep(0.05)


def _applied(status: dict[str, Any]) -> int:
    return sum(p["processed"] + p["replayed"] for p in status["partitions"].values())


def _live(status: dict[str, Any]) -> bool:
    return all(p["phase"] == "live" for p in status["partitions"].values())


async def test_the_cli_finds_the_running_embedded_worker_and_what_it_says_is_true(
    projection: tuple[str, App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="streamapp")
    ref, app = projection
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    await _append(url, EVENTS)
    settings = app.settings(broker="none", event_store=url, web_port=0, data_dir=tmp_path / "d")
    worker = Worker(app, settings, ref)
    lock = db.with_name(f"{db.name}.worker-{app.id}.lock")
    await worker.start()
    try:
        status = await _wait(  # applied, and live: the caught-up marker and checkpoint
            lambda: _status(worker),  # are written after the events are counted as applied
            lambda s: _applied(s) == EVENTS and _live(s),
            "every event applied, every partition live",
        )
        assert lock.exists()  # held while the worker runs
        # /status: where each partition resumes, the store position (embedded: no offsets)
        for partition in status["partitions"].values():
            assert partition["checkpoint"] is not None, partition
            assert partition["checkpoint"] == partition["store_position"], partition
        env = _env(url)
        listed = await _cli(["tables", "-A", ref], env)
        assert listed.exit_code == 0, listed.output
        assert listed.output.splitlines() == ["counts v2 active 4/4"]
        got = await _cli(["tables", "-A", ref, "get", "counts", "s-3"], env)
        assert got.exit_code == 0, got.output
        assert orjson.loads(got.stdout) == EVENTS // STREAMS
        # --url before the command is the one asked (not the settings' port)
        bad = await _cli(
            ["tables", "--url", "http://127.0.0.1:1", "-A", ref, "scan", "counts"], env
        )
        assert bad.exit_code == 1
        assert "cannot reach a worker at http://127.0.0.1:1" in bad.output
        # retire asks the running worker too: it answers which versions there are
        retire = await _cli(["retire", "-A", ref, "counts", "--version", "1"], env)
        assert retire.exit_code == 1
        assert "table 'counts' has no version 1 (its versions: 2)" in retire.output
        views = f"http://127.0.0.1:{worker.web_port}"
        scanned = await _cli(["tables", "--url", views, "scan", "counts"], _env(url))
        assert scanned.exit_code == 0, scanned.output
        assert len(scanned.stdout.splitlines()) == STREAMS
    finally:
        await worker.stop()
    lines = [r.getMessage() for r in caplog.records]
    closed = [m for m in lines if m.startswith("closed in[")]
    assert len(closed) == 4, closed
    for line in closed:  # the next start resumes after what it committed
        assert line.endswith(f"resumes from event-store position {EVENTS + 1}"), line
    assert not lock.exists(), "a clean stop leaves its lock file"
    # stopped: no worker answers, the app's tables are listed without their states
    offline = await _cli(["tables", "-A", ref], _env(url))
    assert offline.exit_code == 0, offline.output
    assert offline.stdout.splitlines() == ["counts v2 (state unknown) 4 partitions, agent count"]
    assert "cannot reach a worker at http://127.0.0.1:" in offline.stderr
    assert "no worker answers for these versions' states" in offline.stderr
    as_json = await _cli(["tables", "-A", ref, "--json"], _env(url))
    assert orjson.loads(as_json.stdout) == {
        "table": "counts",
        "version": 2,
        "partitions": 4,
        "agent": "count",
        "state": None,
    }


async def test_the_head_and_the_caught_up_line_name_the_same_position(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="streamapp")
    url = f"sqlite:///{tmp_path / 'events.db'}"
    await _append(url, 3)
    app = App("caughtup")
    counts: Table[int] = Table("counts")

    @app.agent(app.topic("in", partitions=1), tables=[counts], history=FromEventStore())
    async def count(event: Event, c: TableView[int]) -> None:
        pass

    settings = app.settings(broker="none", event_store=url, web_port=0, data_dir=tmp_path / "d")
    worker = Worker(app, settings)
    await worker.start()
    try:
        await _wait(
            lambda: _status(worker),
            lambda s: s["partitions"]["in[0]"]["caught_up"],
            "the catch-up",
        )
    finally:
        await worker.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert f"event store {url}: head position 3" in lines
    assert "in[0] caught up at store position 3" in lines  # the last applied, as the head


async def test_a_missing_store_directory_is_the_one_error(
    projection: tuple[str, App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamapp")
    ref, app = projection
    url = f"sqlite:///{tmp_path / 'nodir' / 'events.db'}"
    settings = app.settings(broker="none", event_store=url, web_port=0, data_dir=tmp_path / "d")
    with pytest.raises(ConfigError) as info:
        await Worker(app, settings, ref).start()
    assert "nodir" in str(info.value)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [], said  # nothing about retired versions before the real error


def test_topics_create_has_nothing_to_create_in_embedded_mode(projection: tuple[str, App]) -> None:
    ref, _ = projection
    result = CliRunner().invoke(main, ["topics", "create", "-A", ref], env=_env("sqlite:///e.db"))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("nothing to create: ")
    assert "the event store alone, the only source" in result.output


def test_agents_shows_table_versions(projection: tuple[str, App]) -> None:
    ref, _ = projection
    result = CliRunner().invoke(main, ["agents", "-A", ref])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.output)["table_versions"] == {"counts": 2}


def test_a_relative_module_is_refused_naming_the_option_and_its_form() -> None:
    result = CliRunner().invoke(main, ["agents", "-A", ".bank:app"])
    assert result.exit_code == 1
    assert not isinstance(result.exception, TypeError)
    assert result.output.strip() == (
        "Error: -A '.bank:app': '.bank' is not a module name: give the option -A (--app) "
        "in the form module:attribute, an absolute dotted module name and the App's "
        "attribute, e.g. -A agents.orders:app"
    )
