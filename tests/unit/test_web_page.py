"""/openapi.json describes every route; the page at / is served and names its API."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from streamapp.web.views import make_app
from tests.support.webworld import World, orders_app


async def test_openapi_describes_every_route() -> None:
    world = World(orders_app())
    await world.own(range(4))
    app = make_app(world.assignment, "w1")
    routes = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/openapi.json")
        assert r.status == 200
        spec = await r.json()
    assert spec["openapi"].startswith("3.")
    assert set(spec["paths"]) == routes
    assert spec["paths"]["/healthz"]["get"]["security"] == []
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    params = {p["name"] for p in spec["paths"]["/tables/{table}/{key}"]["get"]["parameters"]}
    assert params == {"table", "key", "min_version", "meta", "explain", "as_of", "limit", "version"}
    for path in ("/tables/{table}/{key}", "/tables/{table}"):
        responses = spec["paths"][path]["get"]["responses"]
        for code in ("200", "404", "503"):
            assert "Streamapp-Table-Version" in responses[code]["headers"], (path, code)


async def test_page_is_html_served_without_a_token_and_uses_the_api() -> None:
    world = World(orders_app())
    await world.own(range(4))
    async with TestClient(TestServer(make_app(world.assignment, "w1", token="t0k"))) as client:
        r = await client.get("/")
        assert r.status == 200
        assert r.content_type == "text/html"
        html = await r.text()
    assert "t0k" not in html
    for needle in ("fetch(path, { headers })", '"/tables/"', '"/status"', 'id="key"'):
        assert needle in html
