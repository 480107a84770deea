"""Views of a table with versions in embedded mode (``STREAMAPP_BROKER=none``): one worker
answers v1; restarted with v1 and v2 it builds v2 from the event store and switches once
v2 is live on every partition; v1 stays readable pinned."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import until

from .harness import WorkerProc, append_to_store, wait_ready, worker_progress
from .test_views_versions import APP, HEADER, STATUSES, _settled, _tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_embedded_restart_with_v2_switches_when_it_is_live(tmp_path: Path) -> None:
    ns = f"evv{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    keys = [f"order-{i:03d}" for i in range(120)]
    expected = {k: STATUSES[i % 3] for i, k in enumerate(keys)}
    await append_to_store(
        store, [Event.create(f"order.{expected[k]}", stream_id=k, data={}) for k in keys]
    )

    def worker(versions: str, log: str) -> WorkerProc:
        env = {
            "STREAMAPP_BROKER": "none",
            "STREAMAPP_EVENT_STORE": store,
            "VIEWS_HISTORY": "1",
            "VIEWS_VERSIONS": versions,
        }
        return WorkerProc("127.0.0.1:1", ns, tmp_path / "w", tmp_path / log, APP, extra_env=env)

    w = worker("1", "v1.log").start()
    try:
        await wait_ready(w)
        async with aiohttp.ClientSession() as http:
            for key in keys:
                body, headers = await _settled(http, w, key)
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 1}, "1")
            assert list(await _tables(http, w)) == [1]
            assert w.stop() == 0
            w = worker("1,2", "v2.log").start()  # the restart with the new code
            await wait_ready(w)  # v1's lanes live; v2's builds beside them, then switches

            async def active() -> bool:
                return (await _tables(http, w)).get(2, {}).get("state") == "active"

            await until(  # the build moves: v2's lanes replay, the log grows
                active,
                what="v2 active",
                progress=lambda: worker_progress([w]),
                poll_s=0.2,
                detail=lambda: w.log_text()[-3000:],
            )
            for key in keys:
                body, headers = await _settled(http, w, key)
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 2}, "2"), key
                body, headers = await _settled(http, w, key, "?version=1")
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 1}, "1")
            versions = await _tables(http, w)
            assert (versions[1]["state"], versions[2]["state"]) == ("previous", "active")
            assert versions[2]["declared_by"] == versions[1]["declared_by"]
    finally:
        if w.alive:
            w.stop()
