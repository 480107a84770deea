"""Table endpoints over real partition tasks: list, get (min_version, meta), scan."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from streamapp.tables.partition import PartitionTables
from streamapp.tables.store import MemoryStore
from streamapp.web import tables as web_tables
from streamapp.web.views import make_app
from tests.support.webworld import World, order, orders_app


@pytest.fixture
async def world() -> World:
    w = World(orders_app())
    await w.own([0, 1, 2])  # partition 3 belongs to another worker
    await w.send(*(order(f"order-{i}", version=1) for i in range(40)))
    return w


@pytest.fixture
async def client(world: World) -> AsyncIterator[TestClient[object, object]]:
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as c:
        yield c


def _owned_key(world: World, partitions: set[int]) -> str:
    return next(f"order-{i}" for i in range(40) if world.partition_of(f"order-{i}") in partitions)


async def test_list_tables_with_owned_partitions(client: TestClient[object, object]) -> None:
    body = await (await client.get("/tables")).json()
    (table,) = body["tables"]
    assert table["name"] == "order_status"
    assert table["partitions"] == 4
    assert table["owned"] == {"0": "live", "1": "live", "2": "live"}


async def test_get_value_meta_and_errors(world: World, client: TestClient[object, object]) -> None:
    key = _owned_key(world, {0, 1, 2})
    r = await client.get(f"/tables/order_status/{key}")
    assert r.status == 200
    assert await r.json() == {"status": "placed"}
    assert r.headers["X-Streamapp-Partition"] == str(world.partition_of(key))
    assert r.headers["X-Streamapp-Phase"] == "live"
    r = await client.get(f"/tables/order_status/{key}?meta=1")
    body = await r.json()
    assert body["value"] == {"status": "placed"}
    assert body["partition"] == world.partition_of(key)
    assert body["version"] == 1
    assert body["checkpoint"] == world.ports[body["partition"]].position
    assert (await client.get("/tables/order_status/nobody")).status in (404, 421)
    assert (await client.get("/tables/nope/x")).status == 404
    other = _owned_key(world, {3})
    r = await client.get(f"/tables/order_status/{other}")
    assert r.status == 421
    assert (await r.json())["partition"] == 3


async def test_not_live_partition_answers_503() -> None:
    world = World(orders_app())
    await world.own([0, 1, 2, 3], open=False)
    async with TestClient(TestServer(make_app(world.assignment, "w1"))) as client:
        r = await client.get("/tables/order_status/order-1")
        assert r.status == 503
        assert r.headers["Retry-After"] == "1"
        assert (await r.json())["phase"] == "restoring"
        r = await client.get("/tables/order_status")
        assert r.status == 503


async def test_min_version_waits_for_the_committed_version(
    world: World, client: TestClient[object, object]
) -> None:
    key = _owned_key(world, {0, 1, 2})

    async def later() -> None:
        await asyncio.sleep(0.3)
        await world.send(order(key, "paid", version=2))

    started = time.monotonic()
    sender = asyncio.create_task(later())
    r = await client.get(f"/tables/order_status/{key}?min_version=2")
    await sender
    assert r.status == 200
    assert await r.json() == {"status": "paid"}
    assert time.monotonic() - started >= 0.25
    r = await client.get(f"/tables/order_status/{key}?min_version=1")  # already there
    assert r.status == 200
    assert (await client.get(f"/tables/order_status/{key}?min_version=x")).status == 400


async def test_min_version_never_reached_is_503(
    world: World, client: TestClient[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_tables, "MIN_VERSION_WAIT_S", 0.2)
    key = _owned_key(world, {0, 1, 2})
    r = await client.get(f"/tables/order_status/{key}?min_version=9")
    assert r.status == 503
    assert (await r.json())["stream_version"] == 1
    assert r.headers["Streamapp-Table-Version"] == "1"


def test_committed_version_ignores_the_open_batch() -> None:
    app = orders_app()
    (agent,) = app.agents.values()
    store = MemoryStore(["meta", "versions", "held", "skipped", "t:order_status"])
    tables = PartitionTables(agent.tables, store, 0)
    tables.record_version("s", 3)
    tables.commit_event()  # in the batch, not written
    assert tables.applied_version("s") == 3
    assert tables.committed_version("s") == 0
    tables.write(tables.take_batch(tables.checkpoint))
    assert tables.committed_version("s") == 3


async def test_scan_pages_through_owned_partitions(
    world: World, client: TestClient[object, object]
) -> None:
    owned = {f"order-{i}" for i in range(40) if world.partition_of(f"order-{i}") != 3}
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        r = await client.get("/tables/order_status", params={"limit": "7", "cursor": cursor})
        assert r.status == 200, await r.text()
        body = await r.json()
        assert len(body["items"]) <= 7
        seen += [item["key"] for item in body["items"]]
        pages += 1
        if body["cursor"] is None:
            break
        cursor = body["cursor"]
    assert sorted(seen) == sorted(owned)  # each once, none of partition 3
    assert pages == -(-len(owned) // 7) or pages == -(-len(owned) // 7) + 1
    r = await client.get("/tables/order_status", params={"prefix": "order-1"})
    keys = {item["key"] for item in (await r.json())["items"]}
    assert keys == {k for k in owned if k.startswith("order-1")}
    assert (await client.get("/tables/order_status?cursor=junk")).status == 400
    assert (await client.get("/tables/order_status?limit=0")).status == 400


async def test_long_keys_are_refused_with_414(client: TestClient[object, object]) -> None:
    r = await client.get("/tables/order_status/" + "k" * 1025)
    assert r.status == 414
    assert (await r.json())["max_bytes"] == 1024
    r = await client.get("/tables/order_status", params={"prefix": "p" * 1025})
    assert r.status == 414


VALUES: list[Any] = [
    {"a": 1.5, "b": [1, 2.25e-7, -0.0, 1e300, None, True], "u": 'é\u2028"\\\n\t\x01😀'},
    {"nested": {"x": [{"y": {}}, []]}, "big": 2**63 - 1, "small": -(2**63)},
    [],
    "plain",
    0.1,
    False,
]


async def test_a_json_value_is_answered_as_its_codec_wrote_it(
    world: World, client: TestClient[object, object]
) -> None:
    """A JSON table's stored bytes go out as they are: the body is what decoding and
    encoding them again gave (orjson writes what it reads back byte for byte), plain,
    wrapped by ``?meta=1`` and in a scan's items."""
    keys = [f"odd-{i}" for i in range(len(VALUES))]
    for key, value in zip(keys, VALUES, strict=True):
        p = world.partition_of(key)
        if p not in world.stores:  # partition 3 is another worker's
            continue
        store = world.stores[p]
        raw = orjson.dumps(value)  # what the table's codec (JsonCodec) writes
        assert orjson.dumps(orjson.loads(raw)) == raw
        store.write({"t:order_status": {key.encode(): raw}})
        r = await client.get(f"/tables/order_status/{key}")
        assert r.status == 200
        assert await r.read() == raw
        assert r.headers["Content-Type"] == "application/json"
        r = await client.get(f"/tables/order_status/{key}?meta=1")
        body = await r.read()
        meta = orjson.loads(body)
        assert meta["value"] == value
        assert body == orjson.dumps(meta)  # the same bytes as the dict written whole
        assert list(meta) == [
            "table", "version", "key", "value", "partition", "phase", "stream_version",
            "checkpoint", "store_position",
        ]  # fmt: skip
    assert sum(world.partition_of(k) in world.stores for k in keys) >= 4
    r = await client.get("/tables/order_status", params={"prefix": "odd-", "limit": "100"})
    body = await r.read()
    items = orjson.loads(body)["items"]
    assert {i["key"]: i["value"] for i in items} == {
        k: v for k, v in zip(keys, VALUES, strict=True) if world.partition_of(k) in world.stores
    }
    assert body == orjson.dumps(orjson.loads(body))


async def test_partitions_remembered_are_bounded_and_right(
    world: World, client: TestClient[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_tables, "PARTITION_CACHE_KEYS", 3)
    for _ in range(2):  # the second time: from what is remembered (or forgotten)
        for i in range(40):
            key = f"order-{i}"
            r = await client.get(f"/tables/order_status/{key}")
            if world.partition_of(key) == 3:  # another worker's
                assert (r.status, (await r.json())["partition"]) == (421, 3)
            else:
                assert r.status == 200
                assert r.headers["X-Streamapp-Partition"] == str(world.partition_of(key))
