"""/healthz, /readyz and /status over an assignment of real partition tasks."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app


async def test_healthz_answers_even_while_nothing_is_assigned() -> None:
    world = World(orders_app())  # rebalancing: no partitions yet
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/healthz")
        assert r.status == 200
        assert (await r.json())["status"] == "ok"
        r = await client.get("/readyz")
        assert r.status == 503
        assert (await r.json())["rebalancing"] is True


async def test_readyz_names_partitions_not_live_then_turns_ready() -> None:
    world = World(orders_app())
    await world.own([0, 1])
    await world.own([2], open=False)  # still restoring
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/readyz")
        assert r.status == 503
        assert r.headers["Retry-After"]
        body = await r.json()
        assert body["not_live"] == {"orders[2]": "restoring"}
        assert body["ready"] is False
        await world.task(2).open()
        r = await client.get("/readyz")
        assert r.status == 200, await r.text()
        assert (await r.json())["not_live"] == {}
        world.assignment.rebalancing = True  # a revocation started
        r = await client.get("/readyz")
        assert r.status == 503


async def test_status_shows_agents_phases_lag_and_outcomes() -> None:
    world = World(orders_app())
    await world.own(range(4))
    await world.send(order("order-1"), order("order-2"))
    p = world.partition_of("order-1")
    world.append(order("order-1", "paid"))  # fetched-but-not-processed: lag 1
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        body = await (await client.get("/status")).json()
    assert body["agents"]["project"] == {
        "topic": "orders",
        "partitions": 4,
        "tables": ["order_status"],
        "reads": [],
        "sinks": [],
    }
    part = body["partitions"][f"orders[{p}]"]
    assert part["agents"]["project"]["outcomes"]["delivered"] >= 1
    assert part["phase"] == "live"
    assert part["lag"] == 1
    assert part["outcomes"]["delivered"] >= 1
    assert body["ready"] is True


async def test_status_says_how_long_ago_the_last_rebalance_ended() -> None:
    world = World(orders_app())
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        body = await (await client.get("/status")).json()
        assert body["rebalancing"] is True
        assert body["last_rebalance_s_ago"] is None  # none ended yet
        await world.own(range(2))  # handed out
        first = (await (await client.get("/status")).json())["last_rebalance_s_ago"]
        assert isinstance(first, float)
        assert 0.0 <= first < 60.0
        world.assignment.rebalancing = True  # a revocation started
        assert (await (await client.get("/status")).json())["last_rebalance_s_ago"] is None
        world.assignment.rebalancing = False
        again = (await (await client.get("/status")).json())["last_rebalance_s_ago"]
        assert isinstance(again, float)
        world.assignment.rebalancing = False  # no change: the time stays the last one
        later = (await (await client.get("/status")).json())["last_rebalance_s_ago"]
        assert later >= again
