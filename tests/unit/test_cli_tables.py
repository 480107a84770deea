"""``streamapp tables get|scan`` against a worker's views (a real server on a port)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from streamapp.cli import main
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app, versions_app

TOKEN = "cli-token-9"


@pytest.fixture
async def url() -> AsyncIterator[str]:
    world = World(orders_app())
    await world.own(range(4))
    await world.send(*(order(f"k-{i}") for i in range(25)), order("other-1", "paid"))
    runner = web.AppRunner(make_app(world.assignment, "w1", token=TOKEN))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _cli(args: list[str], token: str | None = TOKEN) -> Result:
    env = {"STREAMAPP_WEB_TOKEN": token} if token else {"STREAMAPP_WEB_TOKEN": ""}
    return await asyncio.to_thread(CliRunner().invoke, main, args, env=env)


async def test_tables_get_prints_the_value(url: str) -> None:
    result = await _cli(["tables", "get", "order_status", "other-1", "--url", url])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.output) == {"status": "paid"}
    result = await _cli(["tables", "get", "order_status", "other-1", "--url", url, "--meta"])
    meta = orjson.loads(result.output)
    assert meta["stream_version"] == 0  # no streamversion on these events
    assert meta["version"] == 1  # the table version that answered


async def test_tables_get_without_token_fails_with_the_json_error(url: str) -> None:
    result = await _cli(["tables", "get", "order_status", "k-1", "--url", url], token=None)
    assert result.exit_code == 1
    assert "answered 401" in result.output
    assert TOKEN not in result.output


async def test_tables_scan_pages_through_everything(url: str) -> None:
    result = await _cli(["tables", "scan", "order_status", "--url", url, "--limit", "4"])
    assert result.exit_code == 0, result.output
    keys = [orjson.loads(line)["key"] for line in result.output.splitlines()]
    assert sorted(keys) == sorted([f"k-{i}" for i in range(25)] + ["other-1"])
    result = await _cli(["tables", "scan", "order_status", "--url", url, "--prefix", "k-2"])
    keys = [orjson.loads(line)["key"] for line in result.output.splitlines()]
    assert sorted(keys) == ["k-2", "k-20", "k-21", "k-22", "k-23", "k-24"]


async def test_unreachable_worker_is_one_line(url: str) -> None:
    result = await _cli(["tables", "get", "t", "k", "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach a worker at http://127.0.0.1:1")


@pytest.fixture
async def versions_url() -> AsyncIterator[str]:
    world = World(versions_app())
    await world.own(range(4))
    await world.task(3).close()  # v1 and v2 live on 3 of 4 partitions
    runner = web.AppRunner(make_app(world.assignment, "w1"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_tables_prints_one_line_per_version(versions_url: str) -> None:
    result = await _cli(["tables", "--url", versions_url], token=None)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "order_status v1 active 3/4",
        "order_status v2 building 3/4",
    ]
    result = await _cli(["tables", "--url", versions_url, "--json"], token=None)
    lines = [orjson.loads(line) for line in result.output.splitlines()]
    assert [(v["table"], v["version"], v["state"]) for v in lines] == [
        ("order_status", 1, "active"),
        ("order_status", 2, "building"),
    ]
    assert lines[1]["declared_by"] == ["w1"]
    assert lines[1]["progress"] is None  # its one partition not live is closed, not building


async def test_tables_finds_the_worker_from_the_apps_settings(versions_url: str) -> None:
    port = versions_url.rsplit(":", 1)[1]
    env = {"STREAMAPP_WEB_TOKEN": "", "STREAMAPP_WEB_PORT": port}
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["tables", "-A", "agents.orders:app"], env=env
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "order_status v1 active 3/4"
