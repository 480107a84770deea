"""The bearer token, JSON errors everywhere, and the token kept out of logs and reprs."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from streamapp import App
from streamapp.errors import ConfigError
from streamapp.settings.settings import Settings
from streamapp.web import scan as web_scan
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app

TOKEN = "s3cret-Token-42"


async def _client(world: World, token: str | None = TOKEN) -> TestClient[object, object]:
    return TestClient(TestServer(make_app(world.assignment, "w1", token=token)))


async def test_token_required_everywhere_but_healthz(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    world = World(orders_app())
    await world.own(range(4))
    await world.send(order("order-1"))
    good = {"Authorization": f"Bearer {TOKEN}"}
    async with await _client(world) as client:
        assert (await client.get("/healthz")).status == 200
        for path in ("/readyz", "/status", "/metrics", "/tables", "/tables/order_status",
                     "/tables/order_status/order-1", "/openapi.json"):  # fmt: skip
            r = await client.get(path)
            assert r.status == 401, path
            assert (await r.json())["error"]
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            r = await client.get(path, headers={"Authorization": "Bearer wrong"})
            assert r.status == 401, path
            r = await client.get(path, headers={"Authorization": TOKEN})  # no scheme
            assert r.status == 401, path
        assert (await client.get("/tables/order_status/order-1", headers=good)).status == 200
        assert (await client.get("/status", headers=good)).status == 200
    assert TOKEN not in caplog.text


async def test_no_token_configured_means_open() -> None:
    world = World(orders_app())
    await world.own(range(4))
    async with await _client(world, token=None) as client:
        assert (await client.get("/status")).status == 200


async def test_every_error_is_json_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(orders_app())
    await world.own(range(4))
    async with await _client(world, token=None) as client:
        r = await client.get("/no/such/route")
        assert r.status == 404
        assert r.content_type == "application/json"
        assert (await r.json())["error"]
        r = await client.post("/status")
        assert r.status == 405
        assert r.content_type == "application/json"

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("kaboom inside")

        monkeypatch.setattr(web_scan, "scan", broken)
        r = await client.get("/tables/order_status")
        assert r.status == 500
        text = await r.text()
        assert r.content_type == "application/json"
        assert "Traceback" not in text
        assert "kaboom" not in text
    assert "kaboom inside" in caplog.text  # logged for the operator, not answered


def test_token_setting_from_env_and_kept_out_of_repr() -> None:
    settings = Settings.from_env("a", env={"STREAMAPP_WEB_TOKEN": TOKEN})
    assert settings.web_token == TOKEN
    assert TOKEN not in repr(settings)
    assert Settings.from_env("a", env={"STREAMAPP_WEB_TOKEN": ""}).web_token is None
    with pytest.raises(ConfigError, match="web_token") as info:
        Settings.from_env("a", env={"STREAMAPP_WEB_TOKEN": "has space"})
    assert "has space" not in str(info.value)


def test_app_settings_accept_the_token() -> None:
    assert App("x").settings(web_token=TOKEN).web_token == TOKEN
    assert isinstance(make_app(World(orders_app()).assignment, "w", token=TOKEN), web.Application)
