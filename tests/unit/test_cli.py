"""The command line and worker start-up: bad input gets a clear error, no broker needed."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from streamapp import App, Backoff, Event, Table, TableView
from streamapp.cli import main
from streamapp.errors import BrokerUnavailableError, ConfigError, ShutdownTimeoutError
from streamapp.worker import Worker
from tests.support.waits import finished


def test_worker_refuses_auto_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMAPP_ENABLE_AUTO_COMMIT", "true")
    result = CliRunner().invoke(main, ["worker", "-A", "agents.orders:app"])
    assert result.exit_code != 0
    assert "enable_auto_commit" in result.output
    assert "STREAMAPP_ENABLE_AUTO_COMMIT" in result.output


def test_worker_refuses_an_unknown_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMAPP_WEB_PROT", "7070")
    result = CliRunner().invoke(main, ["worker", "-A", "agents.orders:app"])
    assert result.exit_code != 0
    assert "STREAMAPP_WEB_PROT names no setting" in result.output
    assert "did you mean STREAMAPP_WEB_PORT (setting web_port)?" in result.output


def test_worker_names_a_bad_app_reference() -> None:
    result = CliRunner().invoke(main, ["worker", "-A", "agents.nope:app"])
    assert result.exit_code != 0
    assert "cannot import 'agents.nope'" in result.output
    result = CliRunner().invoke(main, ["worker", "-A", "agents.orders:missing"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0  # one line
    assert "has no attribute 'missing'" in result.output
    result = CliRunner().invoke(main, ["worker", "-A", "agents.orders:ORDER_EVENTS"])
    assert "is not a streamapp App" in result.output
    result = CliRunner().invoke(main, ["topics", "list"])
    assert result.exit_code == 1
    assert "-A MODULE[:ATTRIBUTE]" in result.output


def test_app_before_or_after_the_command_and_bare_modules() -> None:
    after = CliRunner().invoke(main, ["topics", "list", "-A", "agents.orders:app"])
    before = CliRunner().invoke(main, ["-A", "agents.orders", "topics", "list"])
    assert after.exit_code == 0, after.output
    assert before.exit_code == 0, before.output
    assert before.output == after.output


def test_version_and_unknown_log_level() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("streamapp, version ")
    result = CliRunner().invoke(main, ["-A", "agents.orders", "worker", "-l", "loud"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: unknown log level 'loud': use one of debug, info, warning, error, critical"
    )


def test_agents_lists_topics_tables_policies_history() -> None:
    result = CliRunner().invoke(main, ["agents", "-A", "agents.orders"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    agent = orjson.loads(line)
    assert agent["agent"] == "project_order_status"
    assert agent["topic"] == "orders"
    assert agent["tables"] == ["order_status"]
    assert agent["on_failure"] == "Park(destination='orders.parked')"
    assert agent["history"].startswith("FromEventStore")


def test_topics_list_shows_the_plan() -> None:
    result = CliRunner().invoke(main, ["topics", "list", "-A", "agents.orders:app"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.output.splitlines()]
    assert ["orders", "8 partitions", "source"] in lines
    assert ["orders-project_order_status-changelog", "8 partitions", "changelog"] in lines
    assert ["orders.parked", "8 partitions", "parking"] in lines


async def test_start_gives_up_after_the_retry_budget_and_names_the_setting() -> None:
    app = App("nobroker")
    table: Table[int] = Table("t")

    @app.agent(app.topic("in", partitions=1), tables=[table])
    async def agent(event: Event, t: TableView[int]) -> None: ...

    settings = app.settings(
        kafka_bootstrap="127.0.0.1:1",
        startup_retry=Backoff(attempts=3, initial_s=0.01, max_s=0.02),
        web_port=0,
    )
    with pytest.raises(BrokerUnavailableError, match=r"kafka_bootstrap.*after 3 attempts"):
        await finished(Worker(app, settings).start(), what="the start given up")  # 3 fast tries


async def test_a_taken_web_port_is_named_before_any_broker_is_asked() -> None:
    app = App("busyport")

    @app.agent(app.topic("in", partitions=1))
    async def agent(event: Event) -> None: ...

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = app.settings(kafka_bootstrap="127.0.0.1:1", web_port=port)
        with pytest.raises(ConfigError, match=rf"127.0.0.1:{port}.*--web-port"):
            await Worker(app, settings).start()


def test_an_agent_history_on_another_store_is_refused_with_the_setting() -> None:
    from streamapp import FromEventStore

    app = App("twostores")

    @app.agent(app.topic("in", partitions=1), history=FromEventStore(url="sqlite:///other.db"))
    async def agent(event: Event) -> None: ...

    settings = app.settings(event_store="sqlite:///mine.db")
    with pytest.raises(ConfigError, match=r"STREAMAPP_EVENT_STORE.*'sqlite:///mine.db'"):
        Worker(app, settings)


async def test_store_only_worker_needs_no_broker(tmp_path: Path) -> None:
    app = App("solo")
    seen: list[str] = []

    @app.agent(app.topic("in", partitions=2))
    async def agent(event: Event) -> None:
        seen.append(event.id)

    settings = app.settings(
        broker="none", event_store=f"sqlite:///{tmp_path}/e.db", web_port=0, data_dir=tmp_path
    )
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.source is not None
        assert set(worker.source.assignment.tasks) == {("in", 0), ("in", 1)}
    finally:
        await worker.stop()


async def test_a_stop_past_its_timeout_says_where_it_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = App("stuck")

    @app.agent(app.topic("in", partitions=1))
    async def agent(event: Event) -> None:
        pass

    settings = app.settings(
        broker="none",
        event_store=f"sqlite:///{tmp_path}/e.db",
        web_port=0,
        data_dir=tmp_path,
        rebalance_timeout_ms=1000,
        batch_budget_ms=500,
        shutdown_timeout_s=0.6,
    )
    worker = Worker(app, settings)
    await worker.start()
    assert worker.source is not None
    source_stop = worker.source.stop
    never = asyncio.Event()

    async def wedged_stop() -> None:
        await never.wait()

    worker.source.stop = wedged_stop  # type: ignore[method-assign]
    try:
        with pytest.raises(ShutdownTimeoutError, match="shutdown_timeout_s"):
            await worker.stop()
        stuck = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
        assert any("'worker shutdown'" in m and "wedged_stop" in m for m in stuck), stuck
    finally:
        await source_stop()  # the cancelled shutdown closed the rest
