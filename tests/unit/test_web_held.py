"""Views of a held stream: its last applied value, said to be held; counted per agent."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from streamapp import App, Event, Park, Table, TableView
from streamapp.cli import main
from streamapp.records import Delivery
from streamapp.web.held import HELD_HEADER
from streamapp.web.views import make_app
from tests.support.webworld import PARTITIONS, World, order


def held_app() -> App:
    app = App("heldapp")
    status: Table[dict[str, Any]] = Table("order_status")

    @app.agent(app.topic("orders", partitions=PARTITIONS), tables=[status],
               on_failure=Park("orders.parked", hold="stream"))  # fmt: skip
    async def project(event: Event, statuses: TableView[dict[str, Any]]) -> None:
        if event.type == "order.boom":
            raise RuntimeError("boom in the handler")
        assert event.stream_id is not None
        statuses[event.stream_id] = {"status": event.type.removeprefix("order.")}

    return app


async def test_a_held_key_answers_its_last_value_with_the_header_and_is_counted() -> None:
    parked: list[Delivery] = []

    async def park(delivery: Delivery, reason: str) -> bool:
        parked.append(delivery)
        return True

    world = World(held_app(), park=park)
    await world.own(range(PARTITIONS))
    await world.send(
        order("o-1", version=1), order("o-1", "boom", version=2), order("o-1", "paid", version=3)
    )
    await world.send(order("o-2", version=1), order("o-2", "paid", version=2))
    assert len(parked) == 2
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/tables/order_status/o-1")
        assert r.status == 200
        assert await r.json() == {"status": "placed"}
        assert r.headers[HELD_HEADER] == "2"
        body = await (await client.get("/tables/order_status/o-1?meta=1")).json()
        held = body["held"]
        assert (held["stream"], held["first"], held["events"]) == ("o-1", 2, 2)
        assert "RuntimeError: boom in the handler" in held["error"]

        r = await client.get("/tables/order_status/o-2?meta=1")
        assert HELD_HEADER not in r.headers
        assert "held" not in await r.json()

        assert (await client.get("/readyz")).status == 200
        metrics = await (await client.get("/metrics")).text()
        assert 'streamapp_held_streams{agent="project"} 1.0' in metrics
        assert 'streamapp_held_events{agent="project"} 2.0' in metrics
        status = await (await client.get("/status")).json()
        agent = status["agents"]["project"]
        assert (agent["held_streams"], agent["held_events"]) == (1, 2)
        lanes = [p["agents"]["project"] for p in status["partitions"].values()]
        (lane,) = [lane for lane in lanes if lane["held_streams"]]
        assert lane["held"][0]["stream"] == "o-1"
        (table,) = (await (await client.get("/tables")).json())["tables"]
        assert table["held"] == {"streams": 1, "events": 2}


async def test_streamapp_tables_counts_the_held_streams_of_each_agent() -> None:
    async def park(delivery: Delivery, reason: str) -> bool:
        return True

    world = World(held_app(), park=park)
    await world.own(range(PARTITIONS))
    await world.send(order("o-1", "boom", version=1), order("o-1", "paid", version=2))
    runner = web.AppRunner(make_app(world.assignment, "w1"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        args = ["tables", "--url", url]
        result = await asyncio.to_thread(
            CliRunner().invoke, main, args, env={"STREAMAPP_WEB_TOKEN": ""}
        )
    finally:
        await runner.cleanup()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "order_status v1 active 4/4, 1 held streams of agent project (2 events; worker w1: 1)"
    ]
