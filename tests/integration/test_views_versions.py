"""Views of a table with versions on real Kafka, 2 workers: one of the old code
(``order_status`` v1 only), one of the new (v1 and v2). No worker switches while the old
one owns partitions; pinning, the header on 200s and 503s, 404 naming the versions;
once the old worker is gone and v2 is live on every partition, the switch."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import frozen, until

from .harness import (
    WorkerProc,
    append_to_store,
    create_topics,
    partitions_of,
    wait_caught_up,
    wait_group_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.views_versions_app:app"
HEADER = "Streamapp-Table-Version"
STATUSES = ("placed", "paid", "shipped")


async def _ask(
    http: aiohttp.ClientSession, w: WorkerProc, key: str, query: str = ""
) -> tuple[int, Any, dict[str, str]]:
    url = f"http://127.0.0.1:{w.port}/tables/order_status/{key}{query}"
    async with http.get(url) as r:
        return r.status, await r.json(), dict(r.headers)


async def _settled(
    http: aiohttp.ClientSession, w: WorkerProc, key: str, query: str = ""
) -> tuple[Any, dict[str, str]]:
    """The 200 answer for ``key``; 503s (with Retry-After) are retried while the worker's
    partitions move (its /status: phases, positions, counts)."""

    async def answer() -> tuple[Any, dict[str, str]] | None:
        status, body, headers = await _ask(http, w, key, query)
        if status == 503:
            assert headers["Retry-After"]
            assert HEADER in headers, body
            return None
        assert status == 200, (w.port, key, status, body)
        return body, headers

    async def progress() -> bytes:
        return partitions_of([await w.status()])

    settled: tuple[Any, dict[str, str]] = await until(
        answer, what=f"{key} from {w.port}{query} answered, not 503", progress=progress
    )
    return settled


async def _tables(http: aiohttp.ClientSession, w: WorkerProc) -> dict[int, dict[str, Any]]:
    async with http.get(f"http://127.0.0.1:{w.port}/tables") as r:
        (table,) = (await r.json())["tables"]
    assert table["name"] == "order_status"
    return {v["version"]: v for v in table["versions"]}


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_no_switch_while_old_code_owns_partitions_then_the_switch(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"vv{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}vv-orders"
    create_topics(kafka_bootstrap, ns, APP)  # v1 and v2's changelogs, the members topic
    keys = [f"order-{i:03d}" for i in range(200)]
    store = f"sqlite:///{tmp_path / 'events.db'}"
    await append_to_store(
        store,
        [
            Event.create(f"order.{STATUSES[i % 3]}", stream_id=k, data={})
            for i, k in enumerate(keys)
        ],
    )  # the agents replay it (a new version is built from it: core's refusal otherwise)

    def worker(name: str, versions: str, log: str) -> WorkerProc:
        env = {"VIEWS_VERSIONS": versions, "VIEWS_HISTORY": "1", "STREAMAPP_EVENT_STORE": store}
        return WorkerProc(kafka_bootstrap, ns, tmp_path / name, tmp_path / log, APP, extra_env=env)

    old = worker("old", "1", "old.log").start()
    new = worker("new", "1,2", "new.log").start()
    workers = [old, new]
    try:
        await wait_group_ready(workers, 4)
        await wait_caught_up(kafka_bootstrap, f"{ns}vv", topic, 90, workers)
        new_status = await new.status()
        assert new_status is not None
        mine = {int(name.rsplit("[", 1)[1].rstrip("]")) for name in new_status["partitions"]}
        assert 0 < len(mine) < 4, mine  # each worker owns some partitions
        expected = {k: STATUSES[i % 3] for i, k in enumerate(keys)}
        async with aiohttp.ClientSession() as http:
            # every key from either worker: v1, exact, the header says so
            for w in workers:
                for key in keys:
                    body, headers = await _settled(http, w, key)
                    assert body == {"status": expected[key], "by": 1}, (w.port, key)
                    assert headers[HEADER] == "1"
            versions = await _tables(http, new)
            assert (versions[1]["state"], versions[1]["live"], versions[1]["total"]) == (
                "active", 4, 4,
            )  # fmt: skip
            assert len(versions[1]["declared_by"]) == 2
            assert versions[2]["state"] == "building"
            assert versions[2]["live"] == len(mine)
            assert len(versions[2]["declared_by"]) == 1
            # pinned v2: the new worker's partitions answer v2, the old one's 503 naming v2
            on_old = 0
            for key in keys:
                status, body, headers = await _ask(http, old, key, "?version=2")
                assert headers[HEADER] == "2", (key, status, body)
                if status == 200:
                    assert body == {"status": expected[key], "by": 2}
                    assert headers["X-Streamapp-Forwarded-To"]  # only the new worker has v2
                else:
                    assert status == 503
                    assert headers["Retry-After"]
                    on_old += 1
            assert 0 < on_old < len(keys)
            status, body, _ = await _ask(http, new, keys[0], "?version=3")
            assert status == 404
            assert body["versions"] == [1, 2]
            body, headers = await _settled(http, new, keys[0], "?version=1&meta=1")
            assert (body["version"], body["value"]["by"]) == (1, 1)

            # the old worker leaves: the new one owns every partition; v2's lanes of the
            # moved ones build from the store (v1's restore); then v2 is live on all
            assert old.stop() == 0
            await wait_group_ready([new], 4)
            # ready is not switched: while v2 builds the moved partitions, views answer
            # exact v1 (the model); v2 once GET /tables says it is active
            v2: list[Any] = [None]

            async def active() -> bool:
                v2[0] = (await _tables(http, new))[2]
                if v2[0]["state"] == "active":
                    return True
                for key in keys[:5]:
                    body, headers = await _settled(http, new, key)
                    by = {"1": 1, "2": 2}[headers[HEADER]]
                    assert body == {"status": expected[key], "by": by}, key
                return False

            await until(active, what="v2 active", progress=lambda: frozen(v2[0]), poll_s=0.2)
            for key in keys:
                body, headers = await _settled(http, new, key)
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 2}, "2"), key
            versions = await _tables(http, new)
            assert (versions[1]["state"], versions[2]["state"]) == ("previous", "active")
            assert (versions[2]["live"], versions[2]["total"]) == (4, 4)
            body, headers = await _settled(http, new, keys[0], "?version=1")
            assert (body["by"], headers[HEADER]) == (1, "1")  # v1 pinned, still readable

            # a worker of the old code comes back: the switch stays (one-way), v2 503s
            # on its partitions and v1 is pinned there
            old = worker("old", "1", "old2.log").start()
            workers = [old, new]
            await wait_group_ready(workers, 4)
            seen = set()
            for key in keys:
                status, body, headers = await _ask(http, new, key)
                assert headers[HEADER] == "2", (key, status, body)
                assert status in (200, 503), (key, status, body)
                if status == 200:
                    assert body == {"status": expected[key], "by": 2}
                seen.add(status)
            assert seen == {200, 503}
    finally:
        for w in workers:
            if w.alive:
                w.stop()
