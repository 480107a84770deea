"""State that no longer matches its source is refused at start, loudly, on every transport.

Worker processes of ``provenance_app`` as a user runs them, on the real services: the
state is made in a first run, then the source changes under the kept data directory (the
event store made again, restored from an older copy, the partition count changed, a
table added). Each time the worker must stop by itself, non-zero, with a message naming
the data directory, the store URL or topic, what differs and the fix, and serve nothing
from that state meanwhile. A restart with nothing changed still starts live, no replay.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from streamapp import Event
from streamapp.eventstore.base import display_url
from streamapp.topics import partition_for
from tests.conftest import PgUrlFactory, Services
from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    order_events,
    streamapp_cmd,
    wait_exact,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.provenance_app:app"
RESET = f"streamapp reset -A {APP} --yes"
REFUSE_WITHIN_S = 90.0


def _worker(
    tmp: Path, ns: str, data: str, env: dict[str, str], bootstrap: str = "127.0.0.1:1"
) -> WorkerProc:
    return WorkerProc(
        bootstrap, ns, tmp / data, tmp / f"{data}-{uuid.uuid4().hex[:4]}.log", APP, extra_env=env
    )


def _embedded(url: str, **extra: str) -> dict[str, str]:
    return {"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url, **extra}


async def _run_until_exact(worker: WorkerProc, expected: dict[str, tuple[int, str]]) -> None:
    """Start ``worker``, wait until its view is exact, stop it cleanly."""
    worker.start()
    try:
        await wait_ready(worker, stalled_s=90)
        await wait_exact([worker], expected, "statuses")
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]


async def _refused(worker: WorkerProc, keys: Sequence[str]) -> str:
    """Start ``worker``; it must exit non-zero by itself, and never answer 200 for
    ``keys`` (whose state is the refused one) meanwhile. Returns its log."""
    worker.start()
    assert worker.proc is not None
    answers: list[int] = []
    deadline = time.monotonic() + REFUSE_WITHIN_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while worker.alive and time.monotonic() < deadline:
            for key in keys[:8]:
                try:
                    url = f"http://127.0.0.1:{worker.port}/tables/statuses/{key}"
                    async with http.get(url) as r:
                        answers.append(r.status)
                except (aiohttp.ClientError, TimeoutError):
                    pass  # not serving (yet, or any more)
            await asyncio.sleep(0.05)
    if worker.alive:
        worker.kill()
        raise AssertionError(
            f"the worker was not refused within {REFUSE_WITHIN_S:.0f}s:\n"
            f"{worker.log_text()[-3000:]}"
        )
    text = worker.log_text()
    assert worker.proc.returncode != 0, text[-3000:]
    assert 200 not in answers, f"served from the refused state: {answers}"
    assert "Traceback" not in text, text[-3000:]
    return text


def _store_id(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (found,) = conn.execute("SELECT id FROM streamapp_store").fetchone()
    return str(found)


def _remove_sqlite(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _renamed(events: list[Event], prefix: str) -> list[Event]:
    """``events`` with their stream ids prefixed (another store's orders)."""
    return [
        Event.create(e.type, stream_id=f"{prefix}{e.stream_id}", source="tests", data=e.data)
        for e in events
    ]


def _topics_create(ns: str, env: dict[str, str], bootstrap: str = "127.0.0.1:1") -> str:
    done = run_watched(
        streamapp_cmd("topics", "create", "-A", APP),
        env=app_env(bootstrap, ns, **env),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- embedded (STREAMAPP_BROKER=none), SQLite --------------------------------------------


async def test_embedded_store_made_again_at_the_same_url_is_refused(tmp_path: Path) -> None:
    ns = "prov-same-"
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    events, expected = order_events(n_orders=40, n_events=200, seed=1)
    await append_to_store(url, events)
    await _run_until_exact(_worker(tmp_path, ns, "data", _embedded(url)), expected)
    old_id = _store_id(db)

    _remove_sqlite(db)  # a new store at the same URL, longer than the old one
    others, _ = order_events(n_orders=60, n_events=300, seed=2)
    renamed = _renamed(others, "new-")
    await append_to_store(url, renamed)
    new_id = _store_id(db)
    assert new_id != old_id

    text = await _refused(_worker(tmp_path, ns, "data", _embedded(url)), list(expected))
    assert f"event store {old_id}" in text
    assert f"event store {new_id}" in text
    assert url in text
    assert str(tmp_path / "data") in text
    assert RESET in text
    assert "STREAMAPP_EVENT_STORE back at event store" in text


async def test_embedded_position_past_the_store_head_is_refused(tmp_path: Path) -> None:
    ns = "prov-head-"
    db = tmp_path / "events.db"
    url = f"sqlite:///{db}"
    events, expected = order_events(n_orders=40, n_events=250, seed=3)
    await append_to_store(url, events[:100])
    with sqlite3.connect(db) as live, sqlite3.connect(tmp_path / "older.db") as copy:
        live.backup(copy)  # an older copy of the same store: same identity, 100 events
    await append_to_store(url, events[100:])
    await _run_until_exact(_worker(tmp_path, ns, "data", _embedded(url)), expected)

    _remove_sqlite(db)
    (tmp_path / "older.db").rename(db)
    text = await _refused(_worker(tmp_path, ns, "data", _embedded(url)), list(expected))
    assert "up to position 250, but the store's head is 100" in text
    assert url in text
    assert str(tmp_path / "data") in text
    assert RESET in text


async def test_embedded_partition_count_changed_is_refused(tmp_path: Path) -> None:
    ns = "prov-count-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=200, seed=4)
    await append_to_store(url, events)
    await _run_until_exact(_worker(tmp_path, ns, "data", _embedded(url)), expected)

    env = _embedded(url, PROV_PARTITIONS="2")
    text = await _refused(_worker(tmp_path, ns, "data", env), list(expected))
    assert f"topic '{ns}prov-orders' is declared with 2 partitions" in text
    assert "was made with 4 partitions" in text
    assert "Declare partitions=4 again" in text
    assert str(tmp_path / "data") in text
    assert RESET in text


async def test_embedded_table_added_is_refused(tmp_path: Path) -> None:
    ns = "prov-table-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=200, seed=5)
    await append_to_store(url, events)
    await _run_until_exact(_worker(tmp_path, ns, "data", _embedded(url)), expected)

    env = _embedded(url, PROV_EXTRA_TABLE="1")
    text = await _refused(_worker(tmp_path, ns, "data", env), list(expected))
    assert "agent 'project' declares table(s) ['counts']" in text
    assert "made without them (tables ['statuses'])" in text
    assert f"streamapp reset -A {APP} --agent project --yes" in text
    assert str(tmp_path / "data") in text

    # A new data directory: no state yet, so the new table is built with the others.
    await _run_until_exact(_worker(tmp_path, ns, "fresh", env), expected)


# --- PostgreSQL --------------------------------------------------------------------------


async def test_postgres_schema_made_again_is_refused(
    tmp_path: Path, pg_url_factory: PgUrlFactory, services: Services
) -> None:
    import psycopg

    ns = "prov-pg-"
    events, expected = order_events(n_orders=40, n_events=200, seed=6)
    async with pg_url_factory() as url:
        schema = url.rsplit("search_path%3D", 1)[-1]
        await append_to_store(url, events)
        await _run_until_exact(_worker(tmp_path, ns, "data", _embedded(url)), expected)
        async with await psycopg.AsyncConnection.connect(url) as conn:
            old_id = (await (await conn.execute("SELECT id FROM streamapp_store")).fetchone())[0]
        async with await psycopg.AsyncConnection.connect(services.postgres, autocommit=True) as c:
            await c.execute(f"DROP SCHEMA {schema} CASCADE")
            await c.execute(f"CREATE SCHEMA {schema}")
        others, _ = order_events(n_orders=60, n_events=300, seed=7)
        renamed = _renamed(others, "new-")
        await append_to_store(url, renamed)  # a new store in the new schema: a new identity
        async with await psycopg.AsyncConnection.connect(url) as conn:
            new_id = (await (await conn.execute("SELECT id FROM streamapp_store")).fetchone())[0]
        assert new_id != old_id

        text = await _refused(_worker(tmp_path, ns, "data", _embedded(url)), list(expected))
    assert f"event store {old_id}" in text
    assert f"event store {new_id}" in text
    assert display_url(url) in text
    assert str(tmp_path / "data") in text
    assert RESET in text


# --- Kafka -------------------------------------------------------------------------------


def _kafka(url: str, **extra: str) -> dict[str, str]:
    return {"STREAMAPP_EVENT_STORE": url, **extra}


def _in_partitions(keys: Sequence[str], n: int, below: int) -> list[str]:
    """The keys that fall in partitions ``0 .. below-1`` among ``n``."""
    return [k for k in keys if partition_for(k.encode(), n) < below]


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_kafka_partition_count_changed_is_refused(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    ns = f"prov{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=200, seed=8)
    await append_to_store(url, events)
    _topics_create(ns, {}, kafka_bootstrap)
    env = _kafka(url)
    first = _worker(tmp_path, ns, "data", env, kafka_bootstrap)
    await _run_until_exact(first, expected)

    # The happy path: the same store and counts start live at once, with no replay.
    again = _worker(tmp_path, ns, "data", env, kafka_bootstrap).start()
    try:
        status = await wait_ready(again, stalled_s=90)
        assert status["history"]["reads"] == 0
        assert {p["replayed"] for p in status["partitions"].values()} == {0}
        assert {p["phase"] for p in status["partitions"].values()} == {"live"}
    finally:
        assert again.stop() == 0, again.log_text()[-3000:]

    eight = _kafka(url, PROV_PARTITIONS="8")
    text = await _refused(_worker(tmp_path, ns, "data", eight, kafka_bootstrap), [])
    assert f"topic '{ns}prov-orders' has 4 partitions but the app declares 8" in text
    assert RESET in text

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # the topics re-partitioned, the state kept
        changelog = f"{ns}prov-project-changelog"
        await admin.create_partitions(
            {f"{ns}prov-orders": NewPartitions(8), changelog: NewPartitions(8)}
        )
    finally:
        await admin.close()
    stateful = _in_partitions(list(expected), 8, below=4)
    text = await _refused(_worker(tmp_path, ns, "data", eight, kafka_bootstrap), stateful)
    assert f"topic '{ns}prov-orders' is declared with 8 partitions" in text
    assert "was made with 4 partitions" in text
    assert str(tmp_path / "data") in text
    assert RESET in text

    # Another worker's data directory, empty: the changelog's checkpoints say it too.
    text = await _refused(_worker(tmp_path, ns, "other", eight, kafka_bootstrap), stateful)
    assert "was made with 4 partitions" in text
    assert "or the changelog it was restored from" in text


async def test_kafka_table_added_is_refused(tmp_path: Path, kafka_bootstrap: str) -> None:
    ns = f"prov{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=200, seed=9)
    await append_to_store(url, events)
    _topics_create(ns, {}, kafka_bootstrap)
    await _run_until_exact(_worker(tmp_path, ns, "data", _kafka(url), kafka_bootstrap), expected)

    env = _kafka(url, PROV_EXTRA_TABLE="1")
    text = await _refused(_worker(tmp_path, ns, "data", env, kafka_bootstrap), list(expected))
    assert "agent 'project' declares table(s) ['counts']" in text
    assert str(tmp_path / "data") in text
    assert f"streamapp reset -A {APP} --agent project --yes" in text

    # No local state, but the changelog has it: refused all the same.
    text = await _refused(_worker(tmp_path, ns, "other", env, kafka_bootstrap), list(expected))
    assert "agent 'project' declares table(s) ['counts']" in text
    assert "or the changelog it was restored from" in text


# --- RabbitMQ ----------------------------------------------------------------------------


def _rabbit(amqp: str, url: str, **extra: str) -> dict[str, str]:
    return {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": amqp,
        "STREAMAPP_EVENT_STORE": url,
        **extra,
    }


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_rabbitmq_partition_count_changed_and_table_added_are_refused(
    tmp_path: Path, services: Services
) -> None:
    ns = f"prov{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=200, seed=10)
    await append_to_store(url, events)
    env = _rabbit(services.amqp, url)
    _topics_create(ns, env)
    await _run_until_exact(_worker(tmp_path, ns, "data", env), expected)

    added = _rabbit(services.amqp, url, PROV_EXTRA_TABLE="1")
    text = await _refused(_worker(tmp_path, ns, "data", added), list(expected))
    assert "agent 'project' declares table(s) ['counts']" in text
    assert str(tmp_path / "data") in text
    assert f"streamapp reset -A {APP} --agent project --yes" in text

    two = _rabbit(services.amqp, url, PROV_PARTITIONS="2")  # queues .2 and .3 still there
    text = await _refused(_worker(tmp_path, ns, "data", two), [])
    assert f"queue '{ns}prov-orders.2' exists but topic '{ns}prov-orders'" in text
    assert RESET in text

    eight = _rabbit(services.amqp, url, PROV_PARTITIONS="8")
    _topics_create(ns, eight)  # queues .4 to .7 made; the state of .0 to .3 kept
    stateful = _in_partitions(list(expected), 8, below=4)
    text = await _refused(_worker(tmp_path, ns, "data", eight), stateful)
    assert f"topic '{ns}prov-orders' is declared with 8 partitions" in text
    assert "was made with 4 partitions" in text
    assert str(tmp_path / "data") in text
    assert RESET in text
