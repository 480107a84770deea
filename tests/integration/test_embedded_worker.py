"""STREAMAPP_BROKER=none: the event store is the only source, no broker runs.

Worker processes of the orders app on a SQLite store: events appended while the worker
runs reach its view, a kill -9 and restart keeps the table exact, a second worker of
the same app and store is refused and names the first.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import PgUrlFactory

from tests.support.waits import Stalled, run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    free_port,
    order_events,
    streamapp_cmd,
    wait_exact,
    wait_ready,
    wait_statuses,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NS = "solo-"


def _worker(tmp: Path, url: str, **env: str) -> WorkerProc:
    return WorkerProc(
        "127.0.0.1:1",  # no broker: a Kafka address that nothing answers
        NS,
        tmp / "data",
        tmp / "worker.log",
        extra_env={"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url, **env},
    )


async def test_appended_events_reach_the_view_while_the_worker_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=300, n_events=6_000)
    await append_to_store(url, events[:3_000])
    worker = _worker(tmp_path, url).start()
    try:
        await wait_ready(worker)
        await append_to_store(url, events[3_000:])  # while the worker runs
        await wait_exact([worker], expected)
        status = await worker.status()
        assert status is not None
        assert len(status["partitions"]) == 8  # one worker owns every partition
        assert {p["phase"] for p in status["partitions"].values()} == {"live"}
        assert status["history"]["head"] == 6_000
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]


async def test_kill_9_and_restart_keeps_the_table_exact(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=500, n_events=20_000, seed=3)
    await append_to_store(url, events[:5_000])
    worker = _worker(tmp_path, url).start()
    try:
        await wait_ready(worker)
        appending = asyncio.create_task(_append_slowly(url, events[5_000:]))
        # mid-stream, observed: the worker applied some of the appends, more are coming
        statuses = await wait_statuses(
            [worker], lambda ss: applied(ss[0]) >= 6_000, "6,000 events applied", 60
        )
        assert not appending.done(), "the appends ended before the kill"
        worker.kill()  # mid-stream: appends go on
        at_kill = applied(statuses[0])
        worker = _worker(tmp_path, url).start()
        await appending
        await wait_ready(worker)
        await wait_exact([worker], expected)
        status = await worker.status()
        assert status is not None
        # the restart resumed from its checkpoints, not from the start of the store
        assert applied(status) < 20_000, (applied(status), at_kill)
        print(f"store only: killed after {at_kill} applied; the restart applied {applied(status)}")
    finally:
        if worker.alive:
            worker.kill()


async def test_a_second_worker_of_the_app_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    first = _worker(tmp_path, url).start()
    try:
        await wait_ready(first)
        second = _worker(tmp_path / "other", url)
        (tmp_path / "other").mkdir()
        second.start()
        try:
            code = second.wait_exit()
        except Stalled as stalled:
            second.kill()
            raise AssertionError(f"the second worker was not refused: {stalled}") from None
        assert code != 0
        text = second.log_text()
        assert f"another worker of app '{NS}orders'" in text
        assert "pid" in text  # names the running one
        assert first.alive
    finally:
        assert first.stop() == 0


async def test_the_cli_finds_the_worker_on_postgresql_and_lists_offline_once_it_stopped(
    tmp_path: Path, pg_url_factory: PgUrlFactory
) -> None:
    """The worker records its views in the store's ledger (PostgreSQL here; SQLite in
    tests/unit/test_cli_embedded.py): ``tables`` and ``tables get`` ask it, not the
    settings' port; once it stopped, ``tables`` lists the app's tables offline."""
    events, expected = order_events(n_orders=20, n_events=200)
    async with pg_url_factory() as url:
        await append_to_store(url, events)
        worker = _worker(tmp_path, url).start()
        # the CLI's settings name a port nothing serves: only the ledger finds the worker
        env = app_env(
            "127.0.0.1:1",
            NS,
            STREAMAPP_BROKER="none",
            STREAMAPP_EVENT_STORE=url,
            STREAMAPP_WEB_PORT=str(free_port()),
        )
        try:
            await wait_ready(worker)
            await wait_exact([worker], expected)
            listed = _cli(env, "tables", "-A", "agents.orders:app")
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout.splitlines() == ["order_status v1 active 8/8"]
            key = next(iter(expected))
            got = _cli(env, "tables", "get", "order_status", key, "-A", "agents.orders:app")
            assert got.returncode == 0, got.stderr
            assert orjson.loads(got.stdout)["status"] == expected[key][1]
        finally:
            assert worker.stop() == 0, worker.log_text()[-3000:]
        offline = _cli(env, "tables", "-A", "agents.orders:app")
        assert offline.returncode == 0, offline.stderr
        assert offline.stdout.splitlines() == [
            "order_status v1 (state unknown) 8 partitions, agent project_order_status"
        ]
        assert "no worker answers for these versions' states" in offline.stderr


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(streamapp_cmd(*args), env=env, cwd=ROOT)


def applied(status: dict[str, Any]) -> int:
    """Events the worker applied since it started, replayed or live (its /status)."""
    return sum(int(p["processed"]) + int(p["replayed"]) for p in status["partitions"].values())


async def _append_slowly(url: str, events: list[Any]) -> None:
    for i in range(0, len(events), 1_000):
        await append_to_store(url, events[i : i + 1_000])
        await asyncio.sleep(0.1)
