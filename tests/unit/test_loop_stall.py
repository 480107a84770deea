"""The event-loop stall watchdog and blocking handlers (``blocking=True``), on a real loop
with real blocking calls (the memory broker runs the same partition tasks as a worker)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from streamapp import App, ConfigError, Event, Park, Send, Settings, Table, TableView
from streamapp.engine.stall import Stall, StallWatch
from streamapp.tables.store import RocksStore, reads_from_thread
from streamapp.testing import MemoryBroker


class Reports:
    def __init__(self) -> None:
        self.stalls: list[Stall] = []

    def stalled(self, stall: Stall) -> None:
        self.stalls.append(stall)


def _app(*, blocking: bool, sleep_s: float, returned: list[float]) -> App:
    app = App("stall")
    topic = app.topic("in", partitions=1)
    seen: Table[list[int]] = Table("seen")

    if blocking:

        @app.agent(topic, tables=[seen], blocking=True, name="slow")
        def slow(event: Event, view: TableView[list[int]]) -> None:
            _apply(event, view, sleep_s, returned)

    else:

        @app.agent(topic, tables=[seen], name="slow")
        async def slow_async(event: Event, view: TableView[list[int]]) -> None:
            _apply(event, view, sleep_s, returned)  # blocks the loop: what the watch sees

    return app


def _apply(event: Event, view: TableView[list[int]], sleep_s: float, returned: list[float]) -> None:
    sid = event.stream_id
    assert sid is not None
    if event.type == "slow":
        time.sleep(sleep_s)
        returned.append(time.time())
    view[sid] = [*view.get(sid, []), int(event.extensions["streamversion"])]


def _events(broker: MemoryBroker) -> None:
    broker.send("in", Event.create("fast", stream_id="s", version=1))
    broker.send("in", Event.create("slow", stream_id="s", version=2, id="the-slow-one"))
    broker.send("in", Event.create("fast", stream_id="s", version=3))


async def test_a_handler_blocking_the_loop_is_named_while_it_blocks_and_once_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="streamapp.stall")
    returned: list[float] = []
    broker = MemoryBroker(_app(blocking=False, sleep_s=0.8, returned=returned))
    _events(broker)
    reports = Reports()
    watch = StallWatch(0.2, reports)
    watch.start()
    try:
        await broker.process()
        await asyncio.sleep(watch.tick_s * 3)  # a tick after the stall reports its end
    finally:
        watch.stop()
    assert broker.table("seen").get("s") == [1, 2, 3]
    during = [r for r in caplog.records if "so far" in r.getMessage()]
    ended = [r for r in caplog.records if "was blocked for" in r.getMessage()]
    assert len(during) == 1, caplog.text
    assert len(ended) == 1, caplog.text
    assert during[0].created < returned[0]  # warned while the handler still slept
    text = during[0].getMessage()
    assert "agent 'slow' handling in[0]@1" in text
    assert "stream s, version 2, type slow, id the-slow-one" in text
    assert "test_loop_stall.py" in text  # the line it blocks on
    assert "in _apply" in text
    (stall,) = reports.stalls
    assert stall.agent == "slow"
    assert stall.record.startswith("in[0]@1 ")
    assert stall.seconds > 0.7  # the whole sleep (0.8 s), not only the part seen so far
    assert "blocking=True" in ended[0].getMessage()
    assert watch.stalls == 1
    assert watch.last == stall


async def test_a_blocking_agent_runs_in_a_thread_and_the_loop_does_not_stall() -> None:
    returned: list[float] = []
    broker = MemoryBroker(_app(blocking=True, sleep_s=0.8, returned=returned))
    _events(broker)
    reports = Reports()
    watch = StallWatch(0.2, reports)
    watch.start()
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while not returned:
            ticks += 1
            await asyncio.sleep(0.01)

    try:
        ticker = asyncio.create_task(ticking())
        await broker.process()
        await ticker
    finally:
        watch.stop()
    assert broker.table("seen").get("s") == [1, 2, 3]  # in order, once each
    assert reports.stalls == []
    assert ticks > 10  # the loop ran other work while the handler slept


async def test_a_blocking_handler_fails_through_the_policy_and_sends_with_the_batch() -> None:
    app = App("stall")
    topic = app.topic("in", partitions=2)
    out = app.topic("out", partitions=2)
    seen: Table[list[str]] = Table("seen")
    threads: set[str] = set()

    @app.agent(topic, tables=[seen], sinks=[out], on_failure=Park("in.parked"), blocking=True)
    async def declared(event: Event, view: TableView[list[str]], *, send: Send) -> None:
        threads.add(threading.current_thread().name)
        await asyncio.sleep(0)  # an async handler declared blocking: its thread's own loop
        sid = event.stream_id
        assert sid is not None
        view[sid] = [*view.get(sid, []), event.id]
        if event.id.startswith("bad"):
            raise ValueError("bad event")
        send(out, Event.create("derived", stream_id=sid, id=f"{event.id}/d"))

    broker = MemoryBroker(app)
    for i in range(6):
        broker.send("in", Event.create("e", stream_id=f"k{i % 3}", id=f"e{i}"))
    broker.send("in", Event.create("e", stream_id="k0", id="bad1"))
    await broker.process()
    assert threading.main_thread().name not in threads
    assert all(name.startswith("streamapp agent 'declared'") for name in threads)
    assert broker.table("seen").get("k0") == ["e0", "e3"]  # the failed event rolled back
    assert broker.table("seen").get("k1") == ["e1", "e4"]
    assert [dict(r.headers)["streamapp-agent"] for r in broker.records("in.parked")] == [
        b"declared"
    ]
    assert sorted(r.key for r in broker.records("out") if r.key) == sorted(
        f"k{i % 3}".encode() for i in range(6)
    )


def test_a_plain_def_handler_is_refused_without_blocking_naming_the_fix() -> None:
    app = App("stall")
    topic = app.topic("in", partitions=1)
    with pytest.raises(ConfigError) as info:

        @app.agent(topic)
        def plain(event: Event) -> None: ...

    message = str(info.value)
    for said in ("agent 'plain'", "blocking=True", "async def"):
        assert said in message
    with pytest.raises(ConfigError, match="blocking='yes'"):
        app.agent(topic, blocking="yes")(lambda event: None)  # type: ignore[arg-type]

    @app.agent(topic, blocking=True)
    def fine(event: Event) -> None: ...

    assert app.agents["fine"].blocking


def test_the_stall_bound_is_a_setting() -> None:
    assert Settings.from_env("a", env={}).loop_stall_warn_ms == 500
    assert Settings.from_env("a", env={"STREAMAPP_LOOP_STALL_WARN_MS": "0"}).loop_stall_warn_ms == 0
    with pytest.raises(ConfigError, match=r"loop_stall_warn_ms \(STREAMAPP_LOOP_STALL_WARN_MS\)"):
        Settings.from_env("a", env={"STREAMAPP_LOOP_STALL_WARN_MS": "-5"})


async def test_a_blocking_handlers_reads_do_not_fill_the_store_cache(tmp_path: Path) -> None:
    """The loop alone fills a store's cache: a read from a handler's thread that filled it
    could put back a value the loop replaced meanwhile (another agent's table)."""
    store = RocksStore(tmp_path / "db", ["t"], cache_keys=100)
    try:
        store.write({"t": {b"a": b"1", b"b": b"2"}})
        store._cache["t"].clear()  # as after a restart: nothing cached
        loop = asyncio.get_running_loop()

        def from_thread() -> bytes | None:
            reads_from_thread(loop)
            return store.get("t", b"a")

        assert await asyncio.to_thread(from_thread) == b"1"
        assert b"a" not in store._cache["t"]  # read from RocksDB, not cached
        assert store.get("t", b"b") == b"2"
        assert b"b" in store._cache["t"]  # the loop's own read fills it
    finally:
        store.close()
