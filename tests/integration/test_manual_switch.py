"""``Table(..., switch="manual")`` on a real worker (embedded mode on SQLite): the new
version builds and stays ``built`` (views answer the old one) until ``streamapp versions
switch``; ``versions diff`` compares the two from the store before the switch; a switch
is refused for an auto version and before the version is built."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    streamapp_cmd,
    wait_ready,
    worker_progress,
)
from .test_views_versions import APP, HEADER, STATUSES, _settled, _tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _cli(w: WorkerProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        streamapp_cmd(*args, "-A", APP),
        env=app_env(w.bootstrap, w.namespace, **w.extra_env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a ceiling for a hang, not a budget
        check=False,
    )


async def test_a_manual_version_stays_built_until_switched(tmp_path: Path) -> None:
    ns = f"msw{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    keys = [f"order-{i:03d}" for i in range(60)]
    expected = {k: STATUSES[i % 3] for i, k in enumerate(keys)}
    await append_to_store(
        store, [Event.create(f"order.{expected[k]}", stream_id=k, data={}) for k in keys]
    )
    env = {
        "STREAMAPP_BROKER": "none",
        "STREAMAPP_EVENT_STORE": store,
        "VIEWS_HISTORY": "1",
        "VIEWS_VERSIONS": "1,2",
        "VIEWS_MANUAL": "2",
    }
    w = WorkerProc("127.0.0.1:1", ns, tmp_path / "w", tmp_path / "w.log", APP, extra_env=env)
    w.start()
    try:
        await wait_ready(w)
        async with aiohttp.ClientSession() as http:

            async def built() -> bool:
                return (await _tables(http, w)).get(2, {}).get("state") == "built"

            await until(
                built,
                what="v2 built",
                progress=lambda: worker_progress([w]),
                poll_s=0.2,
                detail=lambda: w.log_text()[-3000:],
            )
            versions = await _tables(http, w)
            assert (versions[1]["state"], versions[2]["live"]) == ("active", 4)
            for key in keys[:10]:  # built, not active: views answer v1, v2 when pinned
                body, headers = await _settled(http, w, key)
                assert (body["by"], headers[HEADER]) == (1, "1")
                body, headers = await _settled(http, w, key, "?version=2")
                assert body == {"status": expected[key], "by": 2}

            listed = _cli(w, "tables")
            assert "order_status v2 built" in listed.stdout, listed.stdout + listed.stderr
            diff = _cli(w, "versions", "diff", "order_status", "--from", "1", "--to", "2",
                        "--sample", "20", "--json")  # fmt: skip
            assert diff.returncode == 0, diff.stderr
            found = json.loads(diff.stdout)
            assert (found["checked"], found["differ"]) == (20, 20)  # "by" differs in each
            assert found["examples"][0]["from"]["by"] == 1
            assert found["examples"][0]["to"]["by"] == 2

            auto = _cli(w, "versions", "switch", "order_status", "--version", "1")
            assert auto.returncode == 1
            assert "declared switch='auto'" in auto.stderr

            switched = _cli(w, "versions", "switch", "order_status", "--version", "2")
            assert switched.returncode == 0, switched.stderr

            async def active() -> bool:
                return (await _tables(http, w)).get(2, {}).get("state") == "active"

            await until(active, what="v2 active after the switch", poll_s=0.2,
                        progress=lambda: worker_progress([w]))  # fmt: skip
            for key in keys[:10]:
                body, headers = await _settled(http, w, key)
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 2}, "2")
    finally:
        if w.alive:
            w.stop()
