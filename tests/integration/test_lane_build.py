"""A new table version builds beside the live one, on Kafka, RabbitMQ and embedded.

``build_app`` runs with ``order_status`` v1 live, then restarts with v1 and v2 (agent
``project_v2``, same topic). v2 catches up from the event store on its own while v1
keeps answering and committing: orders appended during v2's replay reach v1's table
while v2 still catches up. v2 then goes live and is exact (its stores against a fold
over the store), and a ``kill -9`` while v2 builds resumes it from its checkpoint (on
Kafka on a fresh data directory: restored from v2's changelog, as after a move).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamapp import Event, Table
from streamapp.tables.partition import spaces_for
from streamapp.tables.store import RocksStore
from tests.conftest import Services
from tests.support.waits import frozen, run_watched, until

from .harness import (
    ROOT,
    StreamappProc,
    WorkerProc,
    app_env,
    append_to_store,
    order_events,
    streamapp_cmd,
    wait_exact,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.build_app:app"
V2 = Table("order_status", version=2)


@pytest.fixture(params=["none", "kafka", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _env(broker: str, services: Services, url: str, **extra: str) -> dict[str, str]:
    env = {"STREAMAPP_BROKER": broker, "STREAMAPP_EVENT_STORE": url, **extra}
    if broker == "rabbitmq":
        env["STREAMAPP_AMQP_URL"] = services.amqp
    return env


def _topics_create(ns: str, services: Services, env: dict[str, str]) -> None:
    done = run_watched(
        streamapp_cmd("topics", "create", "-A", APP),
        env=app_env(services.kafka, ns, **env),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@contextmanager
def _forwarder(
    broker: str, services: Services, ns: str, tmp: Path, env: dict[str, str]
) -> Iterator[None]:
    """The forwarder publishing the store to the live broker (none in embedded mode)."""
    if broker == "none":
        yield
        return
    proc = StreamappProc(("forward", "-A", APP), services.kafka, ns, tmp / "fwd.log", env)
    proc.start()
    try:
        yield
    finally:
        proc.kill()


def _fold(events: list[Event]) -> dict[str, dict[str, Any]]:
    """What v2 holds for ``events``: last status, count and first status per order."""
    out: dict[str, dict[str, Any]] = {}
    for event in events:
        sid, status = event.stream_id or "", event.type.removeprefix("order.")
        current = out.get(sid)
        out[sid] = {
            "status": status,
            "version": (current["version"] if current else 0) + 1,
            "first": current["first"] if current else status,
        }
    return out


def _v2_stores(data: Path, ns: str) -> dict[str, dict[str, Any]]:
    """v2's table as its partition stores hold it (the worker stopped)."""
    out: dict[str, dict[str, Any]] = {}
    for p in range(4):
        path = data / f"{ns}build" / "project_v2" / str(p)
        store = RocksStore(path, spaces_for([V2]))
        try:
            after: bytes | None = None
            while rows := store.scan(V2.data_space, after, 1000):
                out.update({k.decode(): orjson.loads(v) for k, v in rows})
                after = rows[-1][0]
        finally:
            store.close()
    return out


async def _lanes(worker: WorkerProc) -> dict[str, dict[str, Any]]:
    """Per partition: the task's phase and each agent's (lane's) phase, and where v2's
    replay stands (``v2_at``: its checkpoint's store position)."""
    status = await worker.status()
    if not status:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, p in status["partitions"].items():
        lanes = p["agents"]
        out[name] = {"task": p["phase"], **{a: lane["phase"] for a, lane in lanes.items()}}
        if "project_v2" in lanes:
            out[name]["v2_at"] = lanes["project_v2"]["store_position"]
    return out


def _part_built(lanes: dict[str, dict[str, Any]]) -> bool:
    return any(p["project_v2"] == "catching_up" and (p["v2_at"] or 1) > 1 for p in lanes.values())


async def _wait_lanes(worker: WorkerProc, check: Any, stalled_s: float, what: str) -> None:
    """Until ``check`` holds for the worker's lanes; fails once they (phases, v2's store
    position) stood still for ``stalled_s``."""
    lanes: dict[str, Any] = {}

    async def seen() -> bool:
        assert worker.alive, worker.log_text()[-3000:]
        lanes.clear()
        lanes.update(await _lanes(worker))
        return bool(lanes and check(lanes))

    await until(
        seen,
        what=what,
        progress=lambda: frozen(lanes),
        stalled_s=stalled_s,
        detail=lambda: f"{lanes}\n{worker.log_text()[-3000:]}",
    )


def _building(lanes: dict[str, dict[str, Any]]) -> bool:
    return any(p["task"] == "live" and p["project_v2"] == "catching_up" for p in lanes.values())


def _all_live(lanes: dict[str, dict[str, Any]]) -> bool:
    return len(lanes) == 4 and all(
        {p["task"], p["project"], p["project_v2"]} == {"live"} for p in lanes.values()
    )


async def test_v2_builds_beside_live_v1_and_resumes_after_kill(
    broker: str, services: Services, tmp_path: Path
) -> None:
    ns = f"lb{broker[:2]}{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, _ = order_events(n_orders=300, n_events=3000, seed=5)
    late, _ = order_events(n_orders=40, n_events=120, seed=6)
    late = [
        Event.create(e.type, stream_id=f"late-{e.stream_id}", source="tests", data=e.data)
        for e in late
    ]
    more, _ = order_events(n_orders=300, n_events=600, seed=8)  # after the kill
    v1_env = _env(broker, services, url)
    v2_env = _env(broker, services, url, BUILD_V2="1", BUILD_V2_SLEEP_S="0.004")
    if broker != "none":
        _topics_create(ns, services, v2_env)  # v1's and v2's changelogs, on Kafka
    await append_to_store(url, events)

    def worker(env: dict[str, str], data: str = "data") -> WorkerProc:
        log = tmp_path / f"w-{uuid.uuid4().hex[:4]}.log"
        return WorkerProc(services.kafka, ns, tmp_path / data, log, APP, extra_env=env)

    # On Kafka the restart after the kill takes another data directory, as a worker the
    # partitions move to: v2's store and checkpoint come back from its changelog.
    moved = "data2" if broker == "kafka" else "data"
    with _forwarder(broker, services, ns, tmp_path, v1_env):
        first = worker(v1_env).start()
        try:  # v1 alone, live and exact
            await wait_ready(first, stalled_s=90)
            await wait_exact([first], _expected(events))
        finally:
            assert first.stop() == 0, first.log_text()[-3000:]

        second = worker(v2_env).start()
        try:
            await _wait_lanes(second, _building, 60, "v2 seen building beside live v1")
            await append_to_store(url, late)  # live for v1 while v2 replays
            await wait_exact([second], _expected(events + late))
            lanes = await _lanes(second)
            assert _building(lanes), f"v2 was done before v1 took the live events: {lanes}"
            await _wait_lanes(second, _part_built, 60, "a part of v2's replay committed")
            second.kill()  # kill -9 while v2 builds, some of it committed
        finally:
            if second.alive:
                second.kill()
        built = second.log_text()

        await append_to_store(url, more)
        third = worker(v2_env, moved).start()
        try:
            await _wait_lanes(third, _all_live, 60, "v2 live")
            await wait_exact([third], _expected(events + late + more))
        finally:
            assert third.stop() == 0, third.log_text()[-3000:]
    resumed = third.log_text()
    # the build resumed from its checkpoint: not from store position 1 everywhere
    starts = [
        int(line.rsplit("store position ", 1)[1].split()[0])
        for line in resumed.splitlines()
        if "(building project_v2): catching up from store position" in line
    ]
    assert starts, resumed[-3000:]
    assert max(starts) > 1, (starts, built[-2000:])
    assert "Traceback" not in resumed, resumed[-3000:]
    assert _v2_stores(tmp_path / moved, ns) == _fold(events + late + more)


def _expected(events: list[Event]) -> dict[str, tuple[int, str]]:
    return {sid: (v["version"], v["status"]) for sid, v in _fold(events).items()}


async def test_a_new_table_without_history_is_built_from_a_topic_that_keeps_everything(
    services: Services, tmp_path: Path
) -> None:
    """On Kafka: refused at start while the topic deletes old records (naming it, its
    retention and the fix); built from the earliest offset, exact, once it keeps all."""
    ns = f"lbnh{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, _ = order_events(n_orders=100, n_events=800, seed=9)
    v1_env = _env("kafka", services, url)
    v2_env = _env("kafka", services, url, BUILD_V2="1", BUILD_V2_HISTORY="0", BUILD_V2_SLEEP_S="0")
    _topics_create(ns, services, v2_env)
    await append_to_store(url, events)

    def worker(env: dict[str, str]) -> WorkerProc:
        log = tmp_path / f"w-{uuid.uuid4().hex[:4]}.log"
        return WorkerProc(services.kafka, ns, tmp_path / "data", log, APP, extra_env=env)

    with _forwarder("kafka", services, ns, tmp_path, v1_env):
        first = worker(v1_env).start()
        try:
            await wait_ready(first, stalled_s=90)
            await wait_exact([first], _expected(events))
        finally:
            assert first.stop() == 0, first.log_text()[-3000:]

        # Compaction may drop records: the topic no longer says it holds them all (a topic
        # that deletes by time but still holds its first records builds: test_reset).
        await _topic_config(services.kafka, f"{ns}build-orders", {"cleanup.policy": "compact"})
        refused = worker(v2_env).start()
        code = refused.wait_exit()  # its start-up retries are logged: progress
        text = refused.log_text()
        assert code != 0, text[-3000:]
        assert f"topic '{ns}build-orders'" in text, text[-3000:]
        assert re.search(r"keeps records for retention\.ms=\d+ \(cleanup\.policy=compact\)", text)
        assert "history=FromEventStore()" in text

        await _keep_everything(services.kafka, f"{ns}build-orders")
        second = worker(v2_env).start()
        try:
            await _wait_lanes(second, _all_live, 60, "v2 live")
            await wait_exact([second], _expected(events))
        finally:
            assert second.stop() == 0, second.log_text()[-3000:]
    assert _v2_stores(tmp_path / "data", ns) == _fold(events)


async def _keep_everything(bootstrap: str, topic: str) -> None:
    await _topic_config(bootstrap, topic, {"retention.ms": "-1", "cleanup.policy": "delete"})


async def _topic_config(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
    finally:
        await admin.close()
