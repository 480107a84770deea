"""Forwarding a key to its owner: two workers' views on real ports, each over its own
partitions; the directory says where the other one is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from streamapp.web.views import make_app
from tests.support.doubles import StaticDirectory
from tests.support.webworld import World, order, orders_app

TOKEN = "fwd-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Served:
    world: World
    directory: StaticDirectory
    url: str


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Served, Served]]:
    app = orders_app()
    keys = [f"order-{i}" for i in range(40)]
    runners, served = [], []
    for partitions in ([0, 1], [2, 3]):
        world = World(app)
        await world.own(partitions)
        await world.send(*(order(k, "paid") for k in keys))
        directory = StaticDirectory()
        world.assignment.directory = directory
        runner = web.AppRunner(make_app(world.assignment, f"w{partitions[0]}", token=TOKEN))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        served.append(Served(world, directory, f"http://127.0.0.1:{runner.addresses[0][1]}"))
    a, b = served
    a.directory.owners = {2: b.url, 3: b.url}
    b.directory.owners = {0: a.url, 1: a.url}
    try:
        yield a, b
    finally:
        for runner in runners:
            await runner.cleanup()


def _key_on(world: World, partition: int) -> str:
    return next(f"order-{i}" for i in range(40) if world.partition_of(f"order-{i}") == partition)


async def test_every_key_answers_from_either_worker(pair: tuple[Served, Served]) -> None:
    a, b = pair
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for i in range(40):
            key = f"order-{i}"
            owner = a if a.world.partition_of(key) in (0, 1) else b
            for asked in (a, b):
                async with http.get(f"{asked.url}/tables/order_status/{key}?meta=1") as r:
                    assert r.status == 200, await r.text()
                    body = await r.json()
                    assert body["value"] == {"status": "paid"}
                    forwarded = r.headers.get("X-Streamapp-Forwarded-To")
                    assert forwarded == (None if asked is owner else owner.url)
                    assert r.headers["X-Streamapp-Partition"] == str(body["partition"])


async def test_token_is_forwarded_and_still_required(pair: tuple[Served, Served]) -> None:
    a, _b = pair
    key = _key_on(a.world, 2)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{a.url}/tables/order_status/{key}") as r:
            assert r.status == 401
        async with http.get(f"{a.url}/tables/order_status/{key}", headers=AUTH) as r:
            assert r.status == 200


async def test_unknown_stale_or_silent_owner_is_503_with_retry_after(
    pair: tuple[Served, Served],
) -> None:
    a, _b = pair
    key2, key3 = _key_on(a.world, 2), _key_on(a.world, 3)
    async with aiohttp.ClientSession(headers=AUTH) as http:
        del a.directory.owners[2]  # not known yet
        async with http.get(f"{a.url}/tables/order_status/{key2}") as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
        a.directory.owners[2] = a.url  # stale: points back at a, which does not own it
        async with http.get(f"{a.url}/tables/order_status/{key2}") as r:
            assert r.status == 503  # a's own 421 to a forwarded request becomes 503
            assert r.headers["Retry-After"] == "1"
        a.directory.owners[3] = "http://127.0.0.1:1"  # the owner does not answer
        async with http.get(f"{a.url}/tables/order_status/{key3}") as r:
            assert r.status == 503
            assert "did not answer" in (await r.json())["error"]


async def test_a_forwarded_request_is_not_forwarded_again(pair: tuple[Served, Served]) -> None:
    a, b = pair
    key = _key_on(a.world, 0)
    headers = {**AUTH, "X-Streamapp-Forwarded": "1"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{b.url}/tables/order_status/{key}") as r,
    ):
        assert r.status == 421


async def test_owner_answers_503_pass_through(pair: tuple[Served, Served]) -> None:
    a, b = pair
    task = b.world.task(2)
    await task.close()  # closed: b's partition 2 is not live
    key = _key_on(a.world, 2)
    async with (
        aiohttp.ClientSession(headers=AUTH) as http,
        http.get(f"{a.url}/tables/order_status/{key}") as r,
    ):
        assert r.status == 503
        assert r.headers["Retry-After"] == "1"
        assert r.headers["X-Streamapp-Forwarded-To"] == b.url


async def test_tables_lists_the_owners_of_other_partitions(pair: tuple[Served, Served]) -> None:
    a, b = pair
    async with (
        aiohttp.ClientSession(headers=AUTH) as http,
        http.get(f"{a.url}/tables") as r,
    ):
        (table,) = (await r.json())["tables"]
    assert table["owned"] == {"0": "live", "1": "live"}
    assert table["owners"] == {"2": b.url, "3": b.url}
