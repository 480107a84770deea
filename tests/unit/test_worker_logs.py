"""A worker's lifecycle lines on the embedded event store (real SQLite): one summary of
what it owns instead of lines per partition, "event store only" for STREAMAPP_BROKER=none,
and close lines that name where each partition resumes, checked against the restart."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.eventstore import open_store
from streamapp.worker import Worker
from tests.support.waits import until


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]


async def test_one_summary_line_and_event_store_only_wording(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamapp")
    app = App("summary")
    counts: Table[int] = Table("counts")

    @app.agent(app.topic("in", partitions=4), tables=[counts], history=FromEventStore())
    async def count(event: Event, c: TableView[int]) -> None:
        pass

    settings = app.settings(
        broker="none", event_store=f"sqlite:///{tmp_path}/e.db", web_port=0, data_dir=tmp_path
    )
    worker = Worker(app, settings)
    await worker.start()
    try:
        await until(
            lambda: any("owns" in m for m in _messages(caplog)),
            what="the summary logged",
            progress=lambda: len(caplog.records),
        )
        await asyncio.sleep(0.5)  # a second summary would come within a few polls
    finally:
        await worker.stop()
    lines = _messages(caplog)
    assert [m for m in lines if " owns " in m or m.startswith("owns ")] == [
        "owns 4 partitions: in[0-3] (agent count); live 4"
    ]
    assert not [m for m in lines if m.startswith(("live in[", "assigned in["))], lines
    (started,) = [m for m in lines if " started on " in m]
    assert "started on the event store only" in started
    assert " on none" not in started
    assert not [m for m in lines if "leaving the group" in m], lines


async def test_close_line_names_where_the_partition_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopped in the middle of its catch-up: the close line names the store position the
    next start replays from, which the handler then sees first."""
    caplog.set_level(logging.INFO, logger="streamapp")
    url = f"sqlite:///{tmp_path}/e.db"
    store = await open_store(url)
    try:
        for i in range(1, 401):
            event = Event.create("t", stream_id="s", data={}, id=f"e{i}")
            await store.append("s", [event])
    finally:
        await store.close()
    seen: list[int] = []
    hold = asyncio.Event()

    def make(block_at: int | None) -> App:
        app = App("resume")
        counts: Table[int] = Table("counts")

        @app.agent(app.topic("in", partitions=1), tables=[counts], history=FromEventStore())
        async def count(event: Event, c: TableView[int]) -> None:
            number = int(event.id[1:])
            if block_at is not None and number >= block_at:
                await hold.wait()  # stuck in the replay until the stop
            seen.append(number)

        return app

    def settings(app: App) -> object:
        return app.settings(
            broker="none",
            event_store=url,
            web_port=0,
            data_dir=tmp_path / "data",
            rebalance_timeout_ms=2000,  # the close waits 1 s for the batch in hand
            batch_budget_ms=500,
            max_poll_interval_ms=10_000,
        )

    first_app = make(block_at=250)
    first = Worker(first_app, settings(first_app))  # type: ignore[arg-type]
    await first.start()
    await until(
        lambda: 249 in seen,
        what="the replay reaching the blocked event",
        progress=lambda: len(seen),
    )
    await first.stop()
    (closed,) = [m for m in _messages(caplog) if m.startswith("closed in[0]")]
    assert "(catch-up)" in closed, closed
    resumes_at = int(closed.split("event-store position ")[1].split(" ")[0])
    assert 1 <= resumes_at <= 250
    seen.clear()
    second_app = make(block_at=None)
    second = Worker(second_app, settings(second_app))  # type: ignore[arg-type]
    await second.start()
    try:
        await until(lambda: 400 in seen, what="the replay finishing", progress=lambda: len(seen))
    finally:
        await second.stop()
    assert seen[0] == resumes_at, (closed, seen[:3])


def test_the_summary_joins_partition_runs_per_topic_with_their_agents() -> None:
    from streamapp.engine.assignment import Assignment
    from streamapp.engine.summary import partitions_line

    app = App("lines")
    orders, payments = app.topic("orders", partitions=8), app.topic("payments", partitions=4)

    @app.agent(orders)
    async def status(event: Event) -> None: ...

    @app.agent(orders)
    async def audit(event: Event) -> None: ...

    @app.agent(payments)
    async def paid(event: Event) -> None: ...

    phases = {("orders", p): "live" for p in (0, 1, 2, 5, 7)}
    phases[("payments", 3)] = "catching_up"
    assert partitions_line(Assignment(app), phases) == (
        "owns 6 partitions: orders[0-2,5,7] (agents status, audit); payments[3] (agent paid); "
        "catching_up 1, live 5"
    )
    assert partitions_line(Assignment(app), {}).startswith("owns no partitions")
