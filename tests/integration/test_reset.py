"""``streamapp reset`` against real services: refused while a worker runs (naming it);
with the worker stopped, the agent's stores (and on Kafka its changelog) go, and the
next start rebuilds exactly that agent, with a changed projection, while the other
agent of the topic keeps its state and replays nothing.

Kafka: rebuilt from the topic; RabbitMQ and embedded (``STREAMAPP_BROKER=none``): no
changelog, rebuilt from the event store.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamapp import Event
from tests.conftest import Services
from tests.support.waits import frozen, run_watched, until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    produce,
    read_table,
    streamapp_cmd,
    topic_size,
    wait_caught_up,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.reset_app:app"
STREAMS, EVENTS = 200, 2_000


def workload() -> tuple[list[Event], dict[str, dict[str, int]]]:
    """EVENTS events over STREAMS streams, versioned; per stream: count and sum of n."""
    versions: dict[str, int] = {}
    expected: dict[str, dict[str, int]] = {}
    out = []
    for i in range(EVENTS):
        sid = f"s-{(i * 7) % STREAMS:04d}"
        versions[sid] = versions.get(sid, 0) + 1
        out.append(Event.create("rs.added", stream_id=sid, data={"n": i}, version=versions[sid]))
        seen = expected.setdefault(sid, {"n": 0, "sum": 0})
        seen["n"] += 1
        seen["sum"] += i
    return out, expected


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(
        streamapp_cmd(*args),
        env=env,
        cwd=ROOT,
    )


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file's hash, but RocksDB's info log (``LOG``, ``LOG.old.*``): an open store
    appends to it on its own timers (the stats dump), so it changes with nothing done."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not (p.name == "LOG" or p.name.startswith("LOG.old."))
    }


async def tables(worker: WorkerProc, keys: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        await read_table([worker], "tally", keys),
        await read_table([worker], "latest", keys),
    )


def assert_tally(table: dict[str, Any], expected: dict[str, dict[str, int]], mode: str) -> None:
    weight = {"v1": 1, "v2": 10}[mode]
    want = {k: {"n": e["n"], "sum": weight * e["sum"], "mode": mode} for k, e in expected.items()}
    wrong = {k: (table.get(k), w) for k, w in want.items() if table.get(k) != w}
    assert not wrong, f"{len(wrong)} tally rows wrong, e.g. {list(wrong.items())[:3]}"


async def wait_tally(
    worker: WorkerProc, expected: dict[str, dict[str, int]], mode: str, stalled_s: float = 60
) -> float:
    """Seconds until tally is exact in ``mode``; fails (asserting what is wrong) once its
    values stood still for ``stalled_s``."""
    started = time.monotonic()
    keys = list(expected)
    table: dict[str, Any] = {}

    async def exact() -> bool:
        table.update(await read_table([worker], "tally", keys))
        try:
            assert_tally(table, expected, mode)
        except AssertionError:
            return False
        return True

    try:
        await until(exact, what=f"tally exact in {mode}", progress=lambda: frozen(table))
    except AssertionError:
        assert_tally(table, expected, mode)  # what is wrong
        raise
    return time.monotonic() - started


async def lane_outcomes(worker: WorkerProc) -> dict[str, int]:
    """Deliveries handled by each agent since the worker started (all partitions)."""
    status = await worker.status()
    assert status is not None
    out: dict[str, int] = {}
    for partition in status["partitions"].values():
        for agent, lane in partition["agents"].items():
            out[agent] = out.get(agent, 0) + sum(lane["outcomes"].values())
    return out


def worker_id(worker: WorkerProc) -> str:
    """How the worker names itself to its group (``hostname:pid``)."""
    assert worker.proc is not None
    return f"{socket.gethostname()}:{worker.proc.pid}"


# --- Kafka ------------------------------------------------------------------------------


async def test_kafka_reset_rebuilds_one_agent_from_the_topic(
    services: Services, tmp_path: Path
) -> None:
    ns = f"rk{uuid.uuid4().hex[:6]}-"
    bootstrap, group = services.kafka, f"{ns}rs"
    env = app_env(bootstrap, ns)
    made = run(env, "topics", "create", "-A", APP)
    assert made.returncode == 0, made.stderr
    events, expected = workload()
    await produce(bootstrap, f"{ns}rs-events", events)
    data = tmp_path / "data"

    def worker(mode: str) -> WorkerProc:
        return WorkerProc(
            bootstrap,
            ns,
            data,
            tmp_path / f"worker-{mode}.log",
            app_ref=APP,
            extra_env={"RESET_TALLY_MODE": mode},
        )

    first = worker("v1").start()
    try:
        await wait_ready(first)
        await wait_caught_up(bootstrap, group, f"{ns}rs-events", 90, [first])
        tally, latest = await tables(first, list(expected))
        assert_tally(tally, expected, "v1")
        # Running: refused from another host's data dir (the group names it) and from
        # this one (its stores are open), naming the worker; nothing is removed.
        before = fingerprint(data)
        elsewhere = run(env, "reset", "-A", APP, "--data-dir", str(tmp_path / "other"), "--yes")
        assert elsewhere.returncode == 1, elsewhere.stdout + elsewhere.stderr
        assert f"consumer group {group} on Kafka {bootstrap}: member" in elsewhere.stderr
        assert f"client {ns}rs-worker, host 127.0.0.1) owns" in elsewhere.stderr
        assert f"worker {worker_id(first)} (views http://127.0.0.1:{first.port})" in (
            elsewhere.stderr
        )
        here = run(env, "reset", "-A", APP, "--data-dir", str(data), "--agent", "tally", "--yes")
        assert here.returncode == 1, here.stdout + here.stderr
        assert f"pid {first.proc.pid if first.proc else 0} (" in here.stderr
        assert f"holds table stores open: {data / group / 'tally'} partitions 0, 1, 2, 3" in (
            here.stderr
        )
        assert fingerprint(data) == before
        assert await topic_size(bootstrap, f"{ns}rs-tally-changelog") > 0
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]

    latest_store = fingerprint(data / group / "latest")
    latest_changelog = await topic_size(bootstrap, f"{ns}rs-latest-changelog")
    dry = run(env, "reset", "-A", APP, "--data-dir", str(data), "--agent", "tally")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert (data / group / "tally").exists()
    done = run(env, "reset", "-A", APP, "--data-dir", str(data), "--agent", "tally", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"removed {data / group / 'tally'}" in done.stdout
    assert f"deleted topic {ns}rs-tally-changelog and made it again empty" in done.stdout
    assert "rebuilt on the next start from topic" in done.stdout
    assert not (data / group / "tally").exists()
    assert fingerprint(data / group / "latest") == latest_store
    assert await topic_size(bootstrap, f"{ns}rs-tally-changelog") == 0
    assert await topic_size(bootstrap, f"{ns}rs-latest-changelog") == latest_changelog

    second = worker("v2").start()
    try:
        started = time.monotonic()
        await wait_ready(second)
        await wait_caught_up(bootstrap, group, f"{ns}rs-events", 90, [second])
        took = await wait_tally(second, expected, "v2")
        print(f"kafka: tally rebuilt exactly in {time.monotonic() - started:.1f}s ({took:.1f}s)")
        tally, latest_after = await tables(second, list(expected))
        assert_tally(tally, expected, "v2")  # the changed projection, nothing of v1 left
        assert latest_after == latest  # kept
        assert await lane_outcomes(second) == {"tally": EVENTS, "latest": 0}
        status = await second.status()
        assert status is not None
        assert sum(p["restored"] for p in status["partitions"].values()) == 0
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]


async def test_kafka_reset_remakes_a_changelog_as_declared_and_waits_out_a_killed_worker(
    services: Services, tmp_path: Path
) -> None:
    """A changelog partitioned unlike its source (the source re-made) stops the worker at
    start; the reset makes it again with the declared count, and the worker starts and
    builds the table. Killed with SIGKILL, the worker holds no store any more but stays
    in the group until its session times out: the reset is refused until then."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    ns = f"rx{uuid.uuid4().hex[:6]}-"
    bootstrap, changelog = services.kafka, f"{ns}rs-tally-changelog"
    env = app_env(bootstrap, ns)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        compact = {"cleanup.policy": "compact"}
        await admin.create_topics([NewTopic(changelog, 2, 1, topic_configs=compact)])
    finally:
        await admin.close()
    made = run(env, "topics", "create", "-A", APP)
    assert made.returncode == 0, made.stderr
    events, _ = workload()
    await produce(bootstrap, f"{ns}rs-events", events[:STREAMS])
    expected = {e.stream_id or "": {"n": 1, "sum": i} for i, e in enumerate(events[:STREAMS])}
    data = tmp_path / "data"
    session = {"STREAMAPP_SESSION_TIMEOUT_MS": "6000", "STREAMAPP_HEARTBEAT_INTERVAL_MS": "1000"}

    def worker() -> WorkerProc:
        log = tmp_path / "worker.log"
        return WorkerProc(bootstrap, ns, data, log, app_ref=APP, extra_env=dict(session))

    refused = worker().start()
    assert refused.wait_exit() != 0
    assert f"topic {changelog!r} has 2 partitions but the app declares 4" in refused.log_text()

    done = run(env, "reset", "-A", APP, "--data-dir", str(data), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"deleted topic {changelog} and made it again empty" in done.stdout
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([changelog])
        assert len(described["partitions"]) == 4
    finally:
        await admin.close()

    running = worker().start()
    await wait_ready(running)
    await wait_tally(running, expected, "v1")
    running.kill()
    killed_at = time.monotonic()
    first = run(env, "reset", "-A", APP, "--data-dir", str(data))
    assert first.returncode == 1
    assert f"consumer group {ns}rs on Kafka {bootstrap}: member" in first.stderr
    assert "holds table stores open" not in first.stderr  # the kill dropped the locks
    assert "setting session_timeout_ms = 10000 ms" in first.stderr  # the reset's own setting
    while True:  # a dry run exits 1 either way: refused, or listing what it would remove
        dry = run(env, "reset", "-A", APP, "--data-dir", str(data))
        if "reset refused" not in dry.stderr:
            break
        assert time.monotonic() - killed_at < 30, dry.stderr
    left_after = time.monotonic() - killed_at
    print(f"kafka: the killed worker left the group {left_after:.1f}s after SIGKILL")
    assert "dry run: nothing removed" in dry.stderr
    assert left_after >= 3  # not before the session timed out (6 s, from its last beat)


# --- RabbitMQ and embedded: no changelog, the event store rebuilds ------------------------


@pytest.mark.parametrize("broker", ["rabbitmq", "none"])
async def test_store_fed_reset_rebuilds_one_agent_from_the_event_store(
    services: Services, tmp_path: Path, broker: str
) -> None:
    ns = f"r{broker[0]}{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    extra = {"STREAMAPP_BROKER": broker, "STREAMAPP_EVENT_STORE": url, "RESET_HISTORY": "1"}
    if broker == "rabbitmq":
        extra["STREAMAPP_AMQP_URL"] = services.amqp
    env = app_env("127.0.0.1:1", ns, **extra)
    if broker == "rabbitmq":
        made = run(env, "topics", "create", "-A", APP)
        assert made.returncode == 0, made.stderr
    events, expected = workload()
    await append_to_store(url, events)
    data = tmp_path / "data"

    def worker(mode: str) -> WorkerProc:
        return WorkerProc(
            "127.0.0.1:1",
            ns,
            data,
            tmp_path / f"worker-{mode}.log",
            app_ref=APP,
            extra_env={**extra, "RESET_TALLY_MODE": mode},
        )

    first = worker("v1").start()
    try:
        await wait_ready(first)
        await wait_tally(first, expected, "v1")
        _, latest = await tables(first, list(expected))
        before = fingerprint(data)
        refused = run(env, "reset", "-A", APP, "--data-dir", str(tmp_path / "other"), "--yes")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        if broker == "rabbitmq":
            assert f"member {worker_id(first)} of app '{ns}rs' beats on exchange" in (
                refused.stderr
            )
            assert f"{ns}rs-events.0 (1)" in refused.stderr  # the queue's consumer
        else:
            assert "the event store's worker lock is held" in refused.stderr
            assert f"worker pid {first.proc.pid if first.proc else 0} on" in refused.stderr
        assert fingerprint(data) == before
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]

    latest_store = fingerprint(data / f"{ns}rs" / "latest")
    done = run(env, "reset", "-A", APP, "--data-dir", str(data), "--agent", "tally", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    changelog = "no changelog on RabbitMQ" if broker == "rabbitmq" else "no changelog (STREAM"
    assert changelog in done.stdout
    assert f"rebuilt on the next start by replaying the event store {url}" in done.stdout
    assert not (data / f"{ns}rs" / "tally").exists()
    assert fingerprint(data / f"{ns}rs" / "latest") == latest_store

    second = worker("v2").start()
    try:
        started = time.monotonic()
        await wait_ready(second)
        took = await wait_tally(second, expected, "v2")
        print(f"{broker}: tally rebuilt exactly in {time.monotonic() - started:.1f}s ({took:.1f}s)")
        tally, latest_after = await tables(second, list(expected))
        assert_tally(tally, expected, "v2")
        assert latest_after == latest
        assert await lane_outcomes(second) == {"tally": EVENTS, "latest": 0}
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]
