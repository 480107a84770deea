"""A rebalance that hands a worker back partitions it held keeps their tasks open: no
store reopen, no restore; the partitions it loses are closed; state stays exact."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from streamapp import App, Event, Send, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.topics import partition_for
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
from tests.support.waits import until

from .harness import lag
from .test_failure_policies import _send_raw

pytestmark = pytest.mark.integration

PARTITIONS = 4


def _app(ns: str, bootstrap: str, data_dir: Path) -> App:
    app = App(
        f"{ns}app",
        kafka_bootstrap=bootstrap,
        data_dir=data_dir,
        web_port=0,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    counts: Table[int] = Table("counts")

    @app.agent(app.topic(f"{ns}in", partitions=PARTITIONS), tables=[counts])
    async def count(event: Event, c: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        c[sid] = c.get(sid, 0) + 1

    return app


def _tasks(*workers: Worker | None) -> Callable[[], object]:
    """A wait's progress over in-process workers: each one's partitions, phases and
    counts (events processed, keys restored)."""

    def moved() -> object:
        return tuple(
            tuple(
                sorted(
                    (p, t.phase.name, t.counts.processed, t.counts.restored)
                    for (_, p), t in w.source.assignment.tasks.items()
                )
            )
            for w in workers
            if w is not None
        )

    return moved


async def _drained(bootstrap: str, group: str, topic: str) -> None:
    """Until ``group`` committed all of ``topic``; fails once the lag stood still 60 s."""
    behind = [-1]

    async def drained() -> bool:
        behind[0] = await lag(bootstrap, group, topic)
        return behind[0] == 0

    await until(drained, what=f"{topic} drained by {group}", progress=lambda: behind[0], poll_s=0.2)


def _live(worker: Worker, n: int) -> Callable[[], bool]:
    def check() -> bool:
        tasks = worker.source.assignment.tasks
        return len(tasks) == n and all(t.phase is Phase.LIVE and not t.busy for t in tasks.values())

    return check


def _counts(workers: list[Worker], topic: str, streams: list[str]) -> dict[str, int]:
    """Each stream's count, read from the worker that owns its partition."""
    out: dict[str, int] = {}
    for sid in streams:
        p = partition_for(sid.encode(), PARTITIONS)
        for worker in workers:
            task = worker.source.assignment.tasks.get((topic, p))
            if task is not None and task.tables is not None:
                out[sid] = task.tables.views[0].get(sid, 0)
    return out


async def test_partitions_handed_back_in_a_rebalance_stay_open(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"keep{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}in"
    first = _app(ns, kafka_bootstrap, tmp_path / "a")
    await create_app_topics(first, first.settings())
    streams = [f"s{i}" for i in range(40)]

    async def send(n: int) -> None:
        events = [Event.create("e", stream_id=streams[i % 40], data={}) for i in range(n)]
        await _send_raw(kafka_bootstrap, topic, [codec.encode(e) for e in events])  # type: ignore[misc]

    await send(400)
    a = Worker(first, first.settings())
    await a.start()
    b: Worker | None = None
    try:
        await until(
            _live(a, PARTITIONS), what="worker a live on every partition", progress=_tasks(a)
        )
        await _drained(kafka_bootstrap, first.id, topic)
        before: dict[tuple[str, int], PartitionTask] = dict(a.source.assignment.tasks)
        restored = sum(t.counts.restored for t in before.values())

        second = _app(ns, kafka_bootstrap, tmp_path / "b")
        b = Worker(second, second.settings())
        await b.start()
        await until(
            _live(a, PARTITIONS // 2), what="a keeping half the partitions", progress=_tasks(a, b)
        )
        await until(
            _live(b, PARTITIONS // 2), what="b taking the other half", progress=_tasks(a, b)
        )
        after = a.source.assignment.tasks
        kept = [key for key, task in after.items() if before.get(key) is task]
        assert sorted(kept) == sorted(after)  # every partition a still has: the same task
        assert sum(after[k].counts.restored for k in kept) <= restored  # no restore on the way
        for key, task in before.items():
            if key not in after:
                assert task.phase is Phase.CLOSED  # what a lost is closed

        await send(400)
        await _drained(kafka_bootstrap, first.id, topic)
        both = [a, b]
        await until(
            lambda: sum(_counts(both, topic, streams).values()) == 800,
            what="800 applied",
            progress=_tasks(a, b),
        )
        assert set(_counts(both, topic, streams).values()) == {20}  # each event once, per stream
    finally:
        if b is not None:
            await b.stop()
    try:
        await until(_live(a, PARTITIONS), what="a taking every partition back", progress=_tasks(a))
        await send(400)
        await _drained(kafka_bootstrap, first.id, topic)
        await until(
            lambda: sum(_counts([a], topic, streams).values()) == 1200,
            what="all 1200 applied",
            progress=_tasks(a),
        )
        assert set(_counts([a], topic, streams).values()) == {30}
    finally:
        await a.stop()


async def test_a_caught_up_agent_on_a_transactional_topic_shows_no_lag(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Derived events are written in transactions: each ends with a commit marker. The
    downstream agent commits past the marker it was handed with its last record, so its
    group's lag reads 0 once caught up, not 1 per partition."""
    ns = f"marker{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    source = app.topic(f"{ns}in", partitions=2)
    derived = app.topic(f"{ns}derived", partitions=2)
    seen: Table[int] = Table("seen")

    @app.agent(source, sinks=[derived])
    async def forward(event: Event, *, send: Send) -> None:
        sid = event.stream_id
        assert sid is not None
        send(derived, Event.create("derived", stream_id=sid, id=f"{event.id}/d"))

    @app.agent(derived, tables=[seen])
    async def count(event: Event, c: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        c[sid] = c.get(sid, 0) + 1

    await create_app_topics(app, app.settings())
    events = [Event.create("e", stream_id=f"s{i % 10}", data={}) for i in range(200)]
    await _send_raw(kafka_bootstrap, source.name, [codec.encode(e) for e in events])  # type: ignore[misc]
    worker = Worker(app, app.settings())
    await worker.start()
    try:
        await _drained(kafka_bootstrap, app.id, source.name)
        await _drained(kafka_bootstrap, app.id, derived.name)  # not stuck at 1 per partition
        streams = [f"s{i}" for i in range(10)]
        counts: dict[str, int] = {}
        for sid in streams:
            p = partition_for(sid.encode(), 2)
            task = worker.source.assignment.tasks[(derived.name, p)]
            assert task.tables is not None
            counts[sid] = task.tables.views[0].get(sid, 0)
        assert counts == dict.fromkeys(streams, 20)
    finally:
        await worker.stop()
