"""What a new user types first: ``-A`` as a file path, level names in any case, ``tables``
listing the app's tables, ``tables get|scan`` finding the views from ``-A`` and
``STREAMAPP_WEB_PORT`` (a real server on a port)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from streamapp.cli import main
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app

BANK = """
from streamapp import App, Event

bank = App("bank")

@bank.agent(bank.topic("accounts", partitions=2))
async def audit(event: Event) -> None: ...
"""


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture
def bank_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> str:
    name = f"bank_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(BANK)
    monkeypatch.chdir(tmp_path)
    return name


def test_a_file_path_is_accepted_as_the_app(bank_dir: str) -> None:
    for ref in (f"./{bank_dir}.py:bank", f"{bank_dir}.py:bank"):
        result = _run("topics", "list", "-A", ref)
        assert result.exit_code == 0, result.output
        assert "accounts\t2 partitions\tsource" in result.output


def test_a_missing_file_shows_the_module_form(bank_dir: str) -> None:
    result = _run("topics", "list", "-A", "./nobank.py")
    assert result.exit_code == 1
    assert "no file './nobank.py'" in result.output
    assert "-A nobank:app" in result.output
    assert "Traceback" not in result.output


def test_a_missing_attribute_names_the_apps_and_closest_names(bank_dir: str) -> None:
    result = _run("topics", "list", "-A", f"{bank_dir}.py")  # no ``app`` in it
    assert result.exit_code == 1
    assert f"has no attribute 'app' (did you mean -A {bank_dir}:bank?)" in result.output
    result = _run("topics", "list", "-A", f"{bank_dir}:bnak")
    assert f"did you mean -A {bank_dir}:bank?" in result.output


@pytest.mark.parametrize("level", ["WARN", "warn", "Warning", "INFO", "FATAL"])
def test_level_names_in_any_case(level: str) -> None:
    env = {"STREAMAPP_ENABLE_AUTO_COMMIT": "true"}  # stops the worker after the options
    result = _run("worker", "-A", "agents.orders", "-l", level, env=env)
    assert "unknown log level" not in result.output
    assert "enable_auto_commit" in result.output


EXPECTED = (
    "order_status\t8 partitions\tagent project_order_status\t"
    "changelog orders-project_order_status-changelog"
)


@pytest.mark.parametrize(
    "args",
    [
        ["-A", "agents.orders:app", "tables", "list"],
        ["tables", "list", "-A", "agents.orders:app"],
        ["tables", "-A", "agents.orders", "list"],
    ],
)
def test_tables_lists_the_apps_tables(args: list[str]) -> None:
    result = _run(*args, env={"STREAMAPP_BROKER": "kafka"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [EXPECTED]


def test_tables_without_an_app_says_how_to_give_it() -> None:
    result = _run("tables", "list")
    assert result.exit_code == 1
    assert "-A MODULE[:ATTRIBUTE]" in result.output


@pytest.fixture
async def port() -> AsyncIterator[int]:
    world = World(orders_app())
    await world.own(range(4))
    await world.send(order("o-1", "paid"), order("o-2"))
    runner = web.AppRunner(make_app(world.assignment, "w1"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("with_app", [True, False])
async def test_tables_get_and_scan_find_the_views_from_the_settings(
    port: int, with_app: bool
) -> None:
    env = {"STREAMAPP_WEB_PORT": str(port), "STREAMAPP_WEB_TOKEN": ""}
    app = ["-A", "agents.orders:app"] if with_app else []

    def cli(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env=env)

    got = await asyncio.to_thread(cli, "tables", "get", "order_status", "o-1", *app)
    assert got.exit_code == 0, got.output
    assert orjson.loads(got.output) == {"status": "paid"}
    scan = await asyncio.to_thread(cli, "tables", "scan", "order_status", *app)
    assert scan.exit_code == 0, scan.output
    assert sorted(orjson.loads(x)["key"] for x in scan.output.splitlines()) == ["o-1", "o-2"]
