"""Views while a new table version builds beside the live one (embedded mode, the
event store alone): v1 answers, exact, while v2 replays (``GET /tables``: v2 building,
its progress; ``?version=2``: 503 + Retry-After naming v2 on partitions still building);
once v2 is live on every partition the worker switches to it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.waits import frozen, until

from .harness import WorkerProc, append_to_store, order_events, wait_ready
from .test_views_versions import HEADER, _ask, _settled, _tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.build_app:app"


async def test_v1_answers_while_v2_builds_then_the_switch(tmp_path: Path) -> None:
    ns = f"vb{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=200, n_events=2000, seed=11)
    await append_to_store(url, events)
    env = {"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url}

    def worker(**extra: str) -> WorkerProc:
        log = tmp_path / f"w-{uuid.uuid4().hex[:4]}.log"
        data = tmp_path / "data"
        return WorkerProc("127.0.0.1:1", ns, data, log, APP, extra_env={**env, **extra})

    w = worker().start()
    try:
        await wait_ready(w)
        assert w.stop() == 0
        w = worker(BUILD_V2="1", BUILD_V2_SLEEP_S="0.01").start()  # v2: ~20 s of replay
        async with aiohttp.ClientSession() as http:
            saw_building = saw_503 = False
            versions: dict[int, Any] = {}

            async def active() -> bool:
                nonlocal saw_building, saw_503, versions
                assert w.alive, w.log_text()[-3000:]
                try:
                    versions = await _tables(http, w)
                except (aiohttp.ClientError, ValueError):
                    return False
                v2 = versions.get(2)
                if v2 is not None and v2["state"] == "active":
                    return True
                if v2 is not None and v2["state"] == "building" and v2["progress"]:
                    saw_building = True
                    assert v2["live"] < 4
                    assert v2["progress"]["catching_up"] + v2["live"] == 4
                    assert versions[1]["state"] == "active"
                    for key, (count, status) in list(expected.items())[:40]:
                        body, headers = await _settled(http, w, key)
                        if headers[HEADER] == "2":  # only if the switch came meanwhile
                            now = await _tables(http, w)
                            assert now[2]["state"] == "active", (key, body, now)
                            break
                        assert headers[HEADER] == "1", (key, body)
                        assert (body["version"], body["status"]) == (count, status), key
                        code, body, headers = await _ask(http, w, key, "?version=2")
                        assert headers[HEADER] == "2"
                        if code == 503:
                            assert headers["Retry-After"]
                            saw_503 = True
                        else:
                            assert code == 200, (key, code, body)
                return False

            await until(  # while v2 builds, its progress moves
                active,
                what="v2 active",
                progress=lambda: frozen(versions.get(2)),
                poll_s=0.2,
                detail=lambda: f"{versions}\n{w.log_text()[-3000:]}",
            )
            assert saw_building
            assert saw_503
            for key, (count, status) in expected.items():
                body, headers = await _settled(http, w, key)
                assert headers[HEADER] == "2"
                assert (body["version"], body["status"]) == (count, status), key
                assert "first" in body  # v2's fold
            versions = await _tables(http, w)
            assert (versions[1]["state"], versions[2]["state"]) == ("previous", "active")
            value: Any = (await _settled(http, w, next(iter(expected)), "?version=1"))[0]
            assert "first" not in value
    finally:
        if w.alive:
            w.stop()
