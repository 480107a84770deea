"""Views of a table with versions: the active version answers, ``?version=N`` pins, every
answer names its version, a forwarded key carries it; two workers' views on real
ports, one of the old code (v1 only) and one of the new (v1 and v2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from streamapp.engine.served import DurableLatch, local_tables
from streamapp.web.views import make_app
from tests.support.doubles import TablesDirectory
from tests.support.webworld import World, order, versions_app

HEADER = "Streamapp-Table-Version"
KEYS = [f"order-{i}" for i in range(40)]


@dataclass
class Served:
    world: World
    directory: TablesDirectory
    url: str
    id: str


async def _serve(versions: tuple[int, ...], partitions: list[int], name: str) -> Served:
    world = World(versions_app(versions=versions))
    await world.own(partitions)
    await world.send(*(order(k, "paid") for k in KEYS))
    directory = TablesDirectory()
    world.assignment.directory = directory
    runner = web.AppRunner(make_app(world.assignment, name))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    _runners.append(runner)
    return Served(world, directory, f"http://127.0.0.1:{runner.addresses[0][1]}", name)


_runners: list[web.AppRunner] = []


def _join(a: Served, b: Served) -> None:
    """Each directory names the other's partitions and reads its table versions."""
    for one, other in ((a, b), (b, a)):
        one.directory.owners = {p: other.url for (_, p) in other.world.assignment.tasks}
        one.directory.members = [lambda o=other: local_tables(o.world.assignment, o.id)]


@pytest.fixture
async def cleanup() -> AsyncIterator[None]:
    yield
    while _runners:
        await _runners.pop().cleanup()


def _on(world: World, partition: int) -> str:
    return next(k for k in KEYS if world.partition_of(k) == partition)


async def _get(url: str, path: str) -> tuple[int, dict[str, object], dict[str, str]]:
    async with aiohttp.ClientSession() as http, http.get(url + path) as r:
        return r.status, await r.json(), dict(r.headers)


async def test_one_worker_with_both_versions_live_answers_from_v2(cleanup: None) -> None:
    w = await _serve((1, 2), [0, 1, 2, 3], "w")
    key = _on(w.world, 1)
    status, body, headers = await _get(w.url, f"/tables/order_status/{key}")
    assert (status, body, headers[HEADER]) == (200, {"status": "paid", "by": 2}, "2")
    status, body, headers = await _get(w.url, f"/tables/order_status/{key}?version=1")
    assert (status, body, headers[HEADER]) == (200, {"status": "paid", "by": 1}, "1")
    status, body, _ = await _get(w.url, f"/tables/order_status/{key}?version=1&meta=1")
    assert (body["version"], body["value"]) == (1, {"status": "paid", "by": 1})
    status, body, _ = await _get(w.url, f"/tables/order_status/{key}?version=3")
    assert status == 404
    assert body["versions"] == [1, 2]
    assert "its versions: 1, 2" in str(body["error"])
    status, body, headers = await _get(w.url, "/tables/order_status/nobody")
    assert (status, headers[HEADER]) == (404, "2")  # a key not there names its version too
    status, body, headers = await _get(w.url, "/tables/order_status?limit=1000")
    assert headers[HEADER] == "2"
    assert {i["value"]["by"] for i in body["items"]} == {2}  # type: ignore[index]


async def test_no_switch_while_an_old_code_worker_owns_partitions(cleanup: None) -> None:
    new = await _serve((1, 2), [0, 1], "new")
    old = await _serve((1,), [2, 3], "old")
    _join(new, old)
    for served in (new, old):
        for p in range(4):
            status, body, headers = await _get(
                served.url, f"/tables/order_status/{_on(new.world, p)}"
            )
            assert (status, body, headers[HEADER]) == (200, {"status": "paid", "by": 1}, "1")
    # pinned v2: live on the new worker's partitions, 503 on the old one's (forwarded there)
    status, body, headers = await _get(
        new.url, f"/tables/order_status/{_on(new.world, 0)}?version=2"
    )
    assert (status, body["by"], headers[HEADER]) == (200, 2, "2")
    status, body, headers = await _get(
        new.url, f"/tables/order_status/{_on(new.world, 2)}?version=2"
    )
    assert (status, headers[HEADER], headers["Retry-After"]) == (503, "2", "1")
    assert headers["X-Streamapp-Forwarded-To"] == old.url
    status, body, _ = await _get(new.url, "/tables")
    (table,) = body["tables"]  # type: ignore[misc]
    assert table["versions"] == [
        {"version": 1, "state": "active", "live": 4, "total": 4, "declared_by": ["new", "old"],
         "progress": None},
        {"version": 2, "state": "building", "live": 2, "total": 4, "declared_by": ["new"],
         "progress": None},
    ]  # fmt: skip


async def test_the_switch_once_every_worker_runs_v2_and_it_is_one_way(cleanup: None) -> None:
    a = await _serve((1, 2), [0, 1], "a")
    old = await _serve((1,), [2, 3], "b")
    _join(a, old)
    assert (await _get(a.url, f"/tables/order_status/{_on(a.world, 0)}"))[2][HEADER] == "1"
    b = await _serve((1, 2), [2, 3], "b")  # the rolling restart: b runs the new code
    _join(a, b)
    for served in (a, b):
        for p in range(4):
            key = _on(a.world, p)
            status, body, headers = await _get(served.url, f"/tables/order_status/{key}")
            assert (status, body, headers[HEADER]) == (200, {"status": "paid", "by": 2}, "2")
    # b's partitions go back to a worker of the old code: a keeps answering v2 (503 there)
    _join(a, old)
    old.directory.read = False  # it has not heard of v2: alone it would answer v1, but
    status, _, headers = await _get(a.url, f"/tables/order_status/{_on(a.world, 2)}")
    assert (status, headers[HEADER]) == (503, "2")  # the forward asked it for v2
    status, body, headers = await _get(a.url, f"/tables/order_status/{_on(a.world, 0)}")
    assert (status, body["by"], headers[HEADER]) == (200, 2, "2")
    status, body, _ = await _get(a.url, f"/tables/order_status/{_on(a.world, 2)}?version=1")
    assert (status, body["by"]) == (200, 1)  # v1 pinned is still there


async def test_a_closed_partition_answers_503_naming_the_version(cleanup: None) -> None:
    w = await _serve((1, 2), [0, 1, 2, 3], "w")
    assert (await _get(w.url, f"/tables/order_status/{_on(w.world, 3)}"))[2][HEADER] == "2"
    await w.world.task(3).close()  # v2 is not live everywhere now: it answers v2 still
    status, body, headers = await _get(w.url, f"/tables/order_status/{_on(w.world, 3)}")
    assert (status, headers[HEADER], headers["Retry-After"]) == (503, "2", "1")
    assert body["phase"] == "closed"


async def test_before_the_directory_is_read_unpinned_keys_wait(cleanup: None) -> None:
    w = await _serve((1,), [0, 1, 2, 3], "w")
    w.directory.read = False
    status, body, headers = await _get(w.url, f"/tables/order_status/{_on(w.world, 0)}")
    assert (status, headers[HEADER]) == (503, "1")
    assert "members directory is not read yet" in str(body["error"])
    w.directory.read = True
    status, _, headers = await _get(w.url, f"/tables/order_status/{_on(w.world, 0)}")
    assert (status, headers[HEADER]) == (200, "1")
    w.directory.read = False  # latched now: answers on
    assert (await _get(w.url, f"/tables/order_status/{_on(w.world, 0)}"))[0] == 200


async def test_the_latch_survives_a_restart_in_its_file(cleanup: None, tmp_path: Path) -> None:
    """Answered from v2 once, a worker restarted with v2 not live everywhere yet (v1 is)
    answers v2 (503 where v2 is not live), never v1."""
    path = tmp_path / "app-served-versions.json"
    w = await _serve((1, 2), [0, 1, 2, 3], "w")
    w.world.assignment.served = DurableLatch(path)
    assert (await _get(w.url, f"/tables/order_status/{_on(w.world, 0)}"))[2][HEADER] == "2"
    assert orjson.loads(path.read_bytes()) == {"order_status": 2}
    again = await _serve((1, 2), [0, 1, 2, 3], "w")  # the restarted worker
    again.world.assignment.served = DurableLatch(path)
    await again.world.task(3).close()  # v2 (and v1) not live on partition 3
    status, body, headers = await _get(again.url, f"/tables/order_status/{_on(w.world, 0)}")
    assert (status, body["by"], headers[HEADER]) == (200, 2, "2")
    path.write_bytes(b"not json")
    assert DurableLatch(path) == {}  # a damaged file is ignored (logged), not fatal
