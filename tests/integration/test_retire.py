"""``streamapp retire`` against real services: refused for a version a running worker
or the code still declares, and for the active one; a dry run changes nothing; after a
retire the changelog topic is gone (Kafka) and the version's local stores are removed,
on a running worker at once and on a stopped one at its next start; a worker whose code
still declares the retired version refuses to start; a second retire says so, exit 0.

Kafka: the retirement on the members topic; RabbitMQ and embedded
(``STREAMAPP_BROKER=none``): in the event store's database.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import Event
from streamapp.eventstore import open_store
from streamapp.versions.ledger import Retirement, StoreLedger, encode
from tests.conftest import PgUrlFactory, Services
from tests.support.waits import run_watched, until

from .harness import (
    ROOT,
    WorkerProc,
    alive,
    app_env,
    append_to_store,
    produce,
    streamapp_cmd,
    wait_caught_up,
    wait_group_ready,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.retire_app:app"
STREAMS, EVENTS = 40, 200
BOTH, V2 = {"RETIRE_VERSIONS": "1,2"}, {"RETIRE_VERSIONS": "2"}


def workload() -> list[Event]:
    versions: dict[str, int] = {}
    out = []
    for i in range(EVENTS):
        sid = f"o-{(i * 7) % STREAMS:03d}"
        versions[sid] = versions.get(sid, 0) + 1
        status = ("placed", "paid", "shipped")[versions[sid] % 3]
        out.append(
            Event.create("order.x", stream_id=sid, data={"status": status}, version=versions[sid])
        )
    return out


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(
        streamapp_cmd(*args),
        env=env,
        cwd=ROOT,
    )


def retire(
    env: dict[str, str], worker: WorkerProc, version: int, *more: str
) -> subprocess.CompletedProcess[str]:
    url = f"http://127.0.0.1:{worker.port}"
    return run(
        env, "retire", "-A", APP, "order_status", "--version", str(version), "--url", url, *more
    )


async def topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def views(worker: WorkerProc, path: str) -> tuple[int, str]:
    """A worker's answer to ``GET path``: status and body."""
    url = f"http://127.0.0.1:{worker.port}{path}"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


async def gone(path: Path, worker: WorkerProc) -> None:
    """Until ``path`` no longer exists (the worker heard of the retirement); fails once
    neither the worker's log nor what ``path`` holds changed for a minute."""

    def listing() -> tuple[object, ...]:
        alive([worker])
        held = sorted(str(f) for f in path.rglob("*")) if path.exists() else []
        return worker.log_size(), tuple(held)

    await until(
        lambda: not path.exists(),
        what=f"{path} deleted by the worker on port {worker.port}",
        progress=listing,
        poll_s=0.2,
        detail=lambda: worker.log_text()[-3000:],
    )


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_kafka_retire(services: Services, tmp_path: Path) -> None:
    ns = f"rt{uuid.uuid4().hex[:6]}-"
    bootstrap, group = services.kafka, f"{ns}rt"
    changelog_v1, changelog_v2 = f"{ns}rt-status_v1-changelog", f"{ns}rt-status_v2-changelog"
    cli = {"STREAMAPP_DATA_DIR": str(tmp_path / "cli")}
    both_env, v2_env = app_env(bootstrap, ns, **BOTH, **cli), app_env(bootstrap, ns, **V2, **cli)
    made = run(both_env, "topics", "create", "-A", APP)
    assert made.returncode == 0, made.stderr
    await produce(bootstrap, f"{ns}rt-orders", workload())

    def worker(name: str, code: dict[str, str]) -> WorkerProc:
        log = tmp_path / f"{name}.log"
        return WorkerProc(bootstrap, ns, tmp_path / name, log, app_ref=APP, extra_env=dict(code))

    first, second = worker("a", BOTH).start(), worker("b", BOTH).start()
    try:
        await wait_group_ready([first, second], 4)
        await wait_caught_up(bootstrap, group, f"{ns}rt-orders", 90, [first, second])
        for w in (first, second):
            assert (tmp_path / w.data_dir.name / group / "status_v1").is_dir()
        # The workers run code declaring v1: refused, asked of either, from code without it.
        refused = retire(v2_env, first, 1, "--yes")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "still declare it" in refused.stderr, refused.stderr
        unknown = retire(v2_env, first, 3)
        assert unknown.returncode == 1
        assert "table 'order_status' has no version 3 (its versions: 1, 2)" in unknown.stderr
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]
        assert second.stop() == 0, second.log_text()[-3000:]
    assert changelog_v1 in await topics(bootstrap)

    # v1's agent removed from the code; one worker restarted with it, the other stopped.
    running = worker("b", V2).start()
    try:
        await wait_ready(running)
        active = retire(v2_env, running, 2, "--yes")
        assert active.returncode == 1, active.stdout + active.stderr
        assert "it is the active version" in active.stderr, active.stderr
        assert changelog_v2 in await topics(bootstrap)

        # No worker declares v1, but the code of this command does: refused.
        in_code = retire(both_env, running, 1, "--yes")
        assert in_code.returncode == 1, in_code.stdout + in_code.stderr
        assert "agent 'status_v1' of tests.apps.retire_app:app still writes it" in in_code.stderr

        dry = retire(v2_env, running, 1)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"delete changelog topic {changelog_v1}" in dry.stdout
        assert "(written by agent 'status_v1')" in dry.stdout
        for name in ("a", "b"):  # what each worker said its data directory holds
            where = f"data directory {(tmp_path / name).resolve()}: {group}/{{status_v1}}"
            assert where in dry.stdout, dry.stdout
        assert "dry run: nothing changed" in dry.stderr
        assert changelog_v1 in await topics(bootstrap)
        assert (running.data_dir / group / "status_v1").is_dir()

        done = retire(v2_env, running, 1, "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"deleted topic {changelog_v1}" in done.stdout
        assert changelog_v1 not in await topics(bootstrap)
        await gone(running.data_dir / group / "status_v1", running)  # the running worker, at once
        assert (running.data_dir / group / "status_v2").is_dir()
        assert (running.data_dir / group / "count").is_dir()
        assert (tmp_path / "a" / group / "status_v1").is_dir()  # stopped: not yet
        assert running.alive

        again = retire(v2_env, running, 1, "--yes")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "is retired already" in again.stdout
        pinned = await views(running, "/tables/order_status/o-000?version=1")
        assert pinned[0] == 404, pinned

        stale = worker("c", BOTH).start()  # code still declaring v1: refuses to start
        assert stale.wait_exit() != 0
        assert "table 'order_status' version 1" in stale.log_text()
        assert "was retired" in stale.log_text()

        later = worker("a", V2).start()  # the stopped worker, at its next start
        try:
            await wait_group_ready([running, later], 4)
            assert not (tmp_path / "a" / group / "status_v1").exists()
            assert (tmp_path / "a" / group / "status_v2").is_dir()
        finally:
            assert later.stop() == 0, later.log_text()[-3000:]
    finally:
        assert running.stop() == 0, running.log_text()[-3000:]


@pytest.mark.parametrize("broker", ["rabbitmq", "none"])
async def test_store_fed_retire(services: Services, tmp_path: Path, broker: str) -> None:
    ns = f"t{broker[0]}{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    extra = {
        "STREAMAPP_BROKER": broker,
        "STREAMAPP_EVENT_STORE": url,
        "RETIRE_HISTORY": "1",
        "STREAMAPP_DATA_DIR": str(tmp_path / "cli"),
    }
    if broker == "rabbitmq":
        extra["STREAMAPP_AMQP_URL"] = services.amqp
    both_env, v2_env = (
        app_env("127.0.0.1:1", ns, **extra, **BOTH),
        app_env("127.0.0.1:1", ns, **extra, **V2),
    )
    if broker == "rabbitmq":
        made = run(both_env, "topics", "create", "-A", APP)
        assert made.returncode == 0, made.stderr
    await append_to_store(url, workload())
    data, app_id = tmp_path / "data", f"{ns}rt"

    def worker(name: str, code: dict[str, str]) -> WorkerProc:
        env = {**extra, **code}
        return WorkerProc(
            "127.0.0.1:1", ns, data, tmp_path / f"{name}.log", app_ref=APP, extra_env=env
        )

    first = worker("first", BOTH).start()
    try:
        await wait_ready(first)
        assert (data / app_id / "status_v1").is_dir()
        refused = retire(v2_env, first, 1, "--yes")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "still declare it" in refused.stderr, refused.stderr
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]

    running = worker("second", V2).start()
    try:
        await wait_ready(running)
        assert (data / app_id / "status_v1").is_dir()  # no agent of the code: left, unused
        in_code = retire(both_env, running, 1, "--yes")
        assert in_code.returncode == 1
        assert "still writes it" in in_code.stderr
        dry = retire(v2_env, running, 1)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "dry run: nothing changed" in dry.stderr
        assert (data / app_id / "status_v1").is_dir()
        done = retire(v2_env, running, 1, "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "retired order_status" in done.stdout
        await gone(data / app_id / "status_v1", running)  # the running worker, at once
        assert (data / app_id / "status_v2").is_dir()
        assert running.alive
        again = retire(v2_env, running, 1, "--yes")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "is retired already" in again.stdout
    finally:
        assert running.stop() == 0, running.log_text()[-3000:]
    unreachable = retire(v2_env, running, 2, "--yes")
    assert unreachable.returncode == 1
    assert f"no worker answers at http://127.0.0.1:{running.port}" in unreachable.stderr


async def test_the_ledger_on_postgresql(pg_url_factory: PgUrlFactory) -> None:
    """The ledger's two calls on PostgreSQL: records kept per app, replaced by key."""
    async with pg_url_factory() as url:
        ledger = StoreLedger(await open_store(url), "shop", poll_s=0.01)
        other = StoreLedger(await open_store(url), "another-app")
        try:
            first = Retirement("order_status", 1, "then")
            await ledger.put(first.key, encode(first))
            assert await ledger.records() == [(first.key, encode(first))]
            again = Retirement("order_status", 1, "now")
            await other.put(again.key, encode(again))
            await ledger.put(again.key, encode(again))
            assert await ledger.records() == [(first.key, encode(again))]
            assert await other.records() == [(again.key, encode(again))]
        finally:
            await ledger.close()
            await other.close()
