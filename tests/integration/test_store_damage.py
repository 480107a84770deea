"""Corrupted or truncated local stores: a worker stopped cleanly, its RocksDB files damaged
(bit rot in data blocks, files cut to half, bytes flipped near their end), then started again. The
damaged state is wiped and rebuilt, from its changelog (Kafka) or from the event store
(embedded mode: no changelog); every key ends exact, nothing is parked, no read answers
500 or a wrong value.

A full disk under the data directory (a small tmpfs, filled mid-run, then before a start):
``/readyz`` names it (``disk full under DATA_DIR``) while the worker stops and while the
next one starts, closing the stores never blocks the event loop, and once there is room
again every key comes back exact."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from streamapp.topics import partition_for
from tests.conftest import Services
from tests.support.damage import DAMAGES, flush, open_status, partition_stores, read_statuses
from tests.support.tasks import source_progress
from tests.support.waits import finished, frozen, until

from .harness import (
    StreamappProc,
    WorkerProc,
    alive,
    append_to_store,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    topic_size,
    wait_caught_up,
    wait_exact,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENT = "project_order_status"
PARTITIONS = 8


def _expected(events: list[Event]) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for event in events:
        assert event.stream_id is not None
        count = out.get(event.stream_id, (0, ""))[0]
        out[event.stream_id] = (count + 1, event.type.removeprefix("order."))
    return out


def _by_partition(keys: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for key in keys:
        out[partition_for(key.encode(), PARTITIONS)].append(key)
    return out


def _check_damage(kind: str, stores: list[Path], keys: dict[int, list[str]]) -> None:
    """Each damage is the RocksDB error it is about, on every store."""
    for store in stores:
        status = open_status(store)
        if kind == "rot":  # opens; reads of the damaged blocks fail
            assert status is None, status
            errors = read_statuses(store, keys[int(store.name)])
            assert errors, f"{store}: the damage hit no block its keys are in"
            assert all(e.startswith("Corruption: block checksum mismatch") for e in errors)
        elif kind == "half":
            assert status is not None
            assert status.startswith("Corruption: Sst file size mismatch"), status
        else:  # near the end: found at open; "block checksum" was taken for a held LOCK
            assert status is not None
            assert status.startswith("Corruption: "), status


async def _views(worker: WorkerProc, keys: list[str]) -> list[tuple[str, int, Any, str]]:
    """(key, status, body, Retry-After) of one view read of each key."""
    out = []
    async with aiohttp.ClientSession() as http:
        for key in keys:
            async with http.get(f"http://127.0.0.1:{worker.port}/tables/order_status/{key}") as r:
                out.append((key, r.status, await r.json(), r.headers.get("Retry-After", "")))
    return out


async def _partitions(worker: WorkerProc) -> dict[str, Any]:
    status = await worker.status()
    assert status is not None
    parts: dict[str, Any] = status["partitions"]
    return parts


async def _wait_rebuilt(worker: WorkerProc, names: list[str], stalled_s: float = 60) -> None:
    """Until partitions ``names`` are rebuilt and live; fails once the worker's partitions
    stood still for ``stalled_s``."""
    parts: dict[str, Any] = {}

    async def check() -> bool:
        parts.update(await _partitions(worker))
        return all(parts[n]["rebuilt"] >= 1 and parts[n]["phase"] == "live" for n in names)

    await until(
        check,
        what=f"{names} rebuilt and live",
        progress=lambda: frozen(parts),
        stalled_s=stalled_s,
        poll_s=0.2,
    )


async def _ready(worker: WorkerProc) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{worker.port}/readyz") as r,
    ):
        return r.status


def _no_failures(parts: dict[str, Any]) -> None:
    for name, part in parts.items():
        for outcome in ("failed", "not_deliverable", "refused"):
            assert not part["outcomes"].get(outcome), (name, part["outcomes"])


@pytest.mark.parametrize("kind", list(DAMAGES))
async def test_a_damaged_store_is_restored_from_its_changelog(
    kafka_bootstrap: str, tmp_path: Path, kind: str
) -> None:
    ns = f"damage{kind}{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=800, n_events=3_000, seed=11)
    before = _expected(events[:2_000])
    await produce(kafka_bootstrap, topic, events[:2_000])
    data = tmp_path / "data"
    first = WorkerProc(kafka_bootstrap, ns, data, tmp_path / "first.log").start()
    await wait_ready(first)
    await wait_caught_up(kafka_bootstrap, topic, topic, 90, [first])
    assert first.stop() == 0

    stores = partition_stores(data, f"{ns}orders", AGENT)
    assert len(stores) == PARTITIONS
    keys = _by_partition(list(before))
    for store in stores:
        flush(store)
        DAMAGES[kind](store)
    _check_damage(kind, stores, keys)

    second = WorkerProc(kafka_bootstrap, ns, data, tmp_path / "second.log").start()
    try:
        await wait_ready(second, 120)
        viewed = [f"{topic}[0]", f"{topic}[1]"]
        if kind == "rot":  # a view read of a damaged block: 503, and the partition rebuilt
            answers = await _views(second, keys[0] + keys[1])
            assert {status for _, status, _, _ in answers} <= {200, 503}, answers
            for key, status, body, retry_after in answers:
                if status == 503:
                    assert retry_after, key
                else:
                    assert (body["version"], body["status"]) == before[key], (key, body)
            assert any(status == 503 for _, status, _, _ in answers)
            await _wait_rebuilt(second, viewed)
        await produce(kafka_bootstrap, topic, events[2_000:])
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, [second])
        parts = await _partitions(second)
        rebuilt = {name: part["rebuilt"] for name, part in parts.items()}
        if kind == "rot":  # the others by a handler's read, in a batch
            batch_rebuilt = [n for n, count in rebuilt.items() if count and n not in viewed]
            assert batch_rebuilt, rebuilt
        else:  # found at open, every store
            assert set(rebuilt.values()) == {1}, rebuilt
        assert sum(part["restored"] for part in parts.values()) > 0
        _no_failures(parts)
        table = await read_table([second], "order_status", list(expected))
        assert_exact(table, expected)
        assert await topic_size(kafka_bootstrap, f"{ns}orders.parked") == 0
        assert await _ready(second) == 200
        log = second.log_text()
        for name, count in rebuilt.items():
            if count:
                store = data / f"{ns}orders" / AGENT / name.rsplit("[", 1)[1].rstrip("]")
                assert f"at {store} is corrupt (Corruption: " in log, name
        assert "restored from its changelog" in log
        assert "still locked" not in log
        assert "); parked" not in log
        assert "will redeliver" not in log
    finally:
        if second.alive:
            assert second.stop() == 0, second.log_text()[-3000:]


async def test_a_damaged_store_without_changelog_is_rebuilt_from_the_event_store(
    tmp_path: Path,
) -> None:
    """Embedded mode (STREAMAPP_BROKER=none): no changelog, the event store is the source."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=400, n_events=1_600, seed=5)
    before = _expected(events[:1_000])
    await append_to_store(url, events[:1_000])
    data = tmp_path / "data"

    def worker(log: str) -> WorkerProc:
        return WorkerProc(
            "127.0.0.1:1",
            "solo-",
            data,
            tmp_path / log,
            extra_env={"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url},
        )

    first = worker("first.log").start()
    await wait_ready(first)
    assert_exact(await read_table([first], "order_status", list(before)), before)
    assert first.stop() == 0
    stores = partition_stores(data, "solo-orders", AGENT)
    keys = _by_partition(list(before))
    for store in stores:
        flush(store)
        DAMAGES["rot"](store)
    _check_damage("rot", stores, keys)

    second = worker("second.log").start()
    try:
        await wait_ready(second, 120)
        await append_to_store(url, events[1_000:])  # the feed hands them to the handlers
        await wait_exact([second], expected)
        parts = await _partitions(second)
        assert sum(part["rebuilt"] for part in parts.values()) >= 1, parts
        _no_failures(parts)
        with sqlite3.connect(tmp_path / "events.db") as db:
            (parked,) = db.execute("SELECT count(*) FROM streamapp_parked").fetchone()
        assert parked == 0
        assert await _ready(second) == 200
        log = second.log_text()
        assert "is corrupt (Corruption: block checksum mismatch" in log
        assert "rebuilt from the event store" in log
        assert str(data / "solo-orders" / AGENT) in log
    finally:
        if second.alive:
            assert second.stop() == 0, second.log_text()[-3000:]


async def test_a_damaged_store_on_rabbitmq_is_rebuilt_from_the_event_store(
    services: Services, tmp_path: Path
) -> None:
    """RabbitMQ keeps no changelog: the live batch that reads a damaged block is dropped,
    its deliveries go back to the queue, the store is replayed from the event store, and
    the redelivered messages apply once (stream versions)."""
    from .test_rabbitmq import depth, rabbit_env, topics_create, wait_drained

    ns = f"rdmg{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(services.amqp, STREAMAPP_EVENT_STORE=url, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    events, expected = order_events(n_orders=800, n_events=3_000, seed=13)
    before = _expected(events[:2_000])
    await append_to_store(url, events[:2_000])
    data = tmp_path / "data"

    def worker(log: str) -> WorkerProc:
        return WorkerProc("127.0.0.1:1", ns, data, tmp_path / log, extra_env=env).start()

    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app"), "127.0.0.1:1", ns, tmp_path / "fwd.log", env
    ).start()
    second: WorkerProc | None = None
    try:
        first = worker("first.log")
        await wait_ready(first)
        await wait_drained(services.amqp, ns, first, 90)
        await wait_exact([first], before)
        assert first.stop() == 0
        stores = partition_stores(data, f"{ns}orders", AGENT)
        keys = _by_partition(list(before))
        for store in stores:
            flush(store)
            DAMAGES["rot"](store)
        _check_damage("rot", stores, keys)

        second = worker("second.log")
        await wait_ready(second, 120)
        await append_to_store(url, events[2_000:])  # forwarded, then live batches read
        await wait_exact([second], expected)
        await wait_drained(services.amqp, ns, second, 90)
        parts = await _partitions(second)
        assert sum(part["rebuilt"] for part in parts.values()) >= 1, parts
        _no_failures(parts)
        assert sum([await depth(services.amqp, f"{ns}orders.parked.{p}") for p in range(8)]) == 0
        assert await _ready(second) == 200
        log = second.log_text()
        assert "is corrupt (Corruption: block checksum mismatch" in log
        assert "rebuilt from the event store" in log
        assert "); parked" not in log
    finally:
        forwarder.kill()
        if second is not None and second.alive:
            assert second.stop() == 0, second.log_text()[-3000:]


async def test_a_damaged_store_that_no_source_can_rebuild_is_refused_and_kept(
    services: Services, tmp_path: Path
) -> None:
    """RabbitMQ, an agent with tables and no history: nothing to rebuild from, so the
    worker stops naming the store and the fix, and leaves the directory as it is."""
    from streamapp import App, Table, TableView
    from streamapp.errors import StoreCorruptError
    from streamapp.tables.partition import spaces_for
    from streamapp.tables.store import RocksStore
    from streamapp.transports.rabbitmq.topology import create_topology
    from streamapp.worker import Worker
    from tests.support.damage import cut_to_half

    ns = f"rk{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", broker="rabbitmq", amqp_url=services.amqp, data_dir=tmp_path, web_port=0)
    seen: Table[int] = Table("seen")

    @app.agent(app.topic(f"{ns}in", partitions=1), tables=[seen])
    async def count(event: Event, view: TableView[int]) -> None:
        pass

    store = tmp_path / app.id / "count" / "0"
    made = RocksStore(store, spaces_for([seen]), open_timeout_s=5)
    made.write({seen.data_space: {f"k{i}".encode(): b"1" for i in range(2000)}})
    for family in made._cfs.values():
        family.flush()
    del family  # a column family keeps its store (and LOCK) open
    made.close()
    cut_to_half(store)
    files = {p.name: p.stat().st_size for p in store.glob("*.sst")}

    settings = app.settings()
    await create_topology(app, settings)
    worker = Worker(app, settings)
    await worker.start()
    try:
        assert worker.source is not None
        with pytest.raises(StoreCorruptError) as info:
            await finished(
                worker.source.wait(),
                what="the source failed on the damaged store",
                progress=lambda: source_progress(worker.source),
            )
        message = str(info.value)
        assert str(store) in message
        assert "Sst file size mismatch" in message
        assert "declare history=FromEventStore()" in message
        assert "from a backup" in message
    finally:
        await worker.stop()
    assert {p.name: p.stat().st_size for p in store.glob("*.sst")} == files  # kept as it was


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MB tmpfs of its own (mounting one needs root: skipped without)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write a file on ``disk`` until no space is left; the file."""
    fill = disk / "fill"
    chunk = bytes(1 << 20)
    with fill.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError:
            pass
    return fill


async def _readyz(worker: WorkerProc) -> tuple[int, Any] | None:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{worker.port}/readyz") as r,
        ):
            return r.status, await r.json()
    except aiohttp.ClientError:  # not serving (yet, or any more)
        return None


async def test_a_full_disk_is_named_by_readyz_and_its_stores_close_off_the_loop(
    kafka_bootstrap: str, tmp_path: Path, small_disk: Path
) -> None:
    ns = f"diskfull{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=2_000, n_events=6_000, seed=5)
    await produce(kafka_bootstrap, topic, events[:2_000])
    data = small_disk / "data"
    first = WorkerProc(kafka_bootstrap, ns, data, tmp_path / "first.log").start()
    second: WorkerProc | None = None
    full = f"disk full under {data}"
    try:
        await wait_ready(first)
        await wait_caught_up(kafka_bootstrap, topic, topic, 90, [first])
        fill = _fill(small_disk)
        await produce(kafka_bootstrap, topic, events[2_000:4_000])
        answers: list[tuple[int, Any]] = []

        async def exited() -> bool:  # a store write failed: the partition stops the worker
            answer = await _readyz(first)
            if answer is not None:
                answers.append(answer)
            return not first.alive

        await until(exited, what="the first worker stopped", progress=first.log_size)
        named = [body for code, body in answers if code == 503 and full in (body["disk"] or "")]
        assert named, answers[-3:]
        log = first.log_text()
        assert "the disk failed while writing a batch" in log
        assert "stopping" in log
        blocked = [
            line for line in log.splitlines() if "event loop" in line and " in close" in line
        ]
        assert not blocked, blocked  # a store's close blocked the loop

        second = WorkerProc(kafka_bootstrap, ns, data, tmp_path / "second.log").start()

        async def named_at_start() -> Any:
            alive([second])
            answer = await _readyz(second)
            if answer is None or answer[0] != 503 or full not in (answer[1]["disk"] or ""):
                return None
            return answer[1]

        body = await until(
            named_at_start, what="/readyz names the full disk", progress=second.log_size
        )
        assert body["ready"] is False, body
        fill.unlink()
        await wait_ready(second, 120)
        await produce(kafka_bootstrap, topic, events[4_000:])
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, [second])
        _no_failures(await _partitions(second))
        assert_exact(await read_table([second], "order_status", list(expected)), expected)
        assert await topic_size(kafka_bootstrap, f"{ns}orders.parked") == 0
        code, ready = await _readyz(second) or (0, None)
        assert code == 200, ready
        assert ready["disk"] is None, ready
    finally:
        for worker in (first, second):
            if worker is not None and worker.alive:
                worker.stop()
