"""Views of a table with versions on real RabbitMQ, 2 workers: one of the old code (v1
only), one of the new (v1 and v2). The heartbeats carry each member's table versions: no
switch while the old one holds partitions; once it leaves and the new one has replayed
them for both versions, the switch, and v2 is exact for every key."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest

from streamapp import Event
from tests.conftest import Services
from tests.support.waits import run_watched

from .harness import ROOT, WorkerProc, app_env, append_to_store, streamapp_cmd, wait_group_ready
from .test_rabbitmq import rabbit_env
from .test_views_versions import APP, HEADER, STATUSES, _ask, _settled, _tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_rabbitmq_no_switch_while_old_code_holds_partitions_then_the_switch(
    services: Services, tmp_path: Path
) -> None:
    ns = f"rvv{uuid.uuid4().hex[:6]}-"
    env = rabbit_env(
        services.amqp,
        VIEWS_HISTORY="1",
        STREAMAPP_AMQP_HEARTBEAT_MS="200",
        STREAMAPP_AMQP_SESSION_TIMEOUT_MS="1500",
        STREAMAPP_POLL_TIMEOUT_MS="200",
    )
    run = run_watched(
        streamapp_cmd("topics", "create", "-A", APP),
        env=app_env("127.0.0.1:1", ns, **env),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    store = f"sqlite:///{tmp_path / 'events.db'}"
    keys = [f"order-{i:03d}" for i in range(120)]
    expected = {k: STATUSES[i % 3] for i, k in enumerate(keys)}
    await append_to_store(
        store, [Event.create(f"order.{expected[k]}", stream_id=k, data={}) for k in keys]
    )

    def worker(name: str, versions: str) -> WorkerProc:
        extra = {**env, "VIEWS_VERSIONS": versions, "STREAMAPP_EVENT_STORE": store}
        return WorkerProc(
            "127.0.0.1:1", ns, tmp_path / name, tmp_path / f"{name}.log", APP, extra_env=extra
        )

    old, new = worker("old", "1").start(), worker("new", "1,2").start()
    workers = [old, new]
    try:
        try:
            await wait_group_ready(workers, 4)
        except AssertionError as exc:
            raise AssertionError(old.log_text()[-2000:] + new.log_text()[-2000:]) from exc
        async with aiohttp.ClientSession() as http:
            for w in workers:
                for key in keys:
                    body, headers = await _settled(http, w, key)
                    assert (body, headers[HEADER]) == ({"status": expected[key], "by": 1}, "1")
            versions = await _tables(http, new)
            assert (versions[1]["state"], versions[2]["state"]) == ("active", "building")
            assert 0 < versions[2]["live"] < 4
            statuses = set()
            for key in keys:
                status, body, headers = await _ask(http, new, key, "?version=2")
                assert headers[HEADER] == "2", (key, status, body)
                statuses.add(status)
                if status == 200:
                    assert body == {"status": expected[key], "by": 2}
            assert statuses == {200, 503}  # the old worker's partitions have no v2

            assert old.stop() == 0
            await wait_group_ready([new], 4)
            for key in keys:
                body, headers = await _settled(http, new, key)
                assert (body, headers[HEADER]) == ({"status": expected[key], "by": 2}, "2"), key
            versions = await _tables(http, new)
            assert (versions[1]["state"], versions[2]["state"]) == ("previous", "active")
    finally:
        for w in workers:
            if w.alive:
                w.stop()
