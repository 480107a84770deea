"""Catch-up progress on a real worker and SQLite store: a line every few seconds by events
applied (a store smaller than one read chunk included), counts and an ETA that hold,
``/status`` counts that grow; a poison event is named in ``/status``, ``/readyz`` and the
log, and the events read again to retry it are not counted twice."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.catchup import progress as catchup_progress
from streamapp.eventstore import Append, open_store
from streamapp.worker import Worker
from tests.support.waits import frozen, until

EVENTS = 12_000
COUNTS: Table[int] = Table("counts")
LINE = re.compile(r"catching up: (\d+) of (\d+) events applied \(store head (\d+)\), .*ETA (\d+)s")


async def _fill(url: str, n: int, poison: int | None = None) -> None:
    store = await open_store(url)
    try:
        await store.append_many(
            [
                Append(
                    f"s-{i % 50}",
                    [
                        Event.create(
                            "order.poison" if i == poison else "order.placed",
                            stream_id=f"s-{i % 50}",
                            id=f"e{i}",
                            data={"i": i},
                        )
                    ],
                )
                for i in range(1, n + 1)
            ]
        )
    finally:
        await store.close()


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        return r.status, await r.json()


def _worker(app: App, url: str, tmp_path: Path) -> Worker:
    settings = app.settings(
        broker="none", event_store=url, web_port=0, data_dir=tmp_path, poll_timeout_ms=100
    )
    return Worker(app, settings)


async def test_progress_is_logged_by_events_applied_with_an_eta_while_work_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catchup_progress, "EVERY_S", 1.0)
    url = f"sqlite:///{tmp_path}/e.db"
    await _fill(url, EVENTS)  # fewer than one read chunk (50,000)
    app = App("progress")

    @app.agent(app.topic("orders", partitions=1), tables=[COUNTS], history=FromEventStore())
    async def agent(event: Event, counts: TableView[int]) -> None:
        counts[event.stream_id or ""] = counts.get(event.stream_id or "", 0) + 1
        busy = time.perf_counter() + 0.0004  # ~5 s for the store: long enough to watch
        while time.perf_counter() < busy:
            pass

    worker = _worker(app, url, tmp_path)
    seen: list[int] = []
    with caplog.at_level(logging.INFO, logger="streamapp.catchup"):
        await worker.start()
        try:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{worker.web_port}"
                while (await _get(http, f"{base}/readyz"))[0] != 200:
                    _, body = await _get(http, f"{base}/status")
                    progress = body["history"]["progress"]
                    if progress["active"] and progress["total"]:  # 0: nothing read yet
                        assert progress["total"] == EVENTS
                        seen.append(progress["applied"])
                    await asyncio.sleep(0.3)
        finally:
            await worker.stop()
    ended = next(r for r in caplog.records if r.getMessage().startswith("caught up:"))
    assert ended.getMessage().startswith(f"caught up: {EVENTS} events applied in ")
    lines = [(r.created, LINE.search(r.getMessage())) for r in caplog.records]
    found = [(at, m) for at, m in lines if m is not None]
    assert len(found) >= 3, [r.getMessage() for r in caplog.records]
    applied = [int(m.group(1)) for _, m in found]
    assert applied == sorted(applied)  # a stalled machine may log one count twice
    assert len(set(applied)) >= 3, applied
    assert all(int(m.group(2)) == EVENTS and int(m.group(3)) == EVENTS for _, m in found)
    for at, m in found:  # never "ETA 0s" with most of the work left (the old chunk count)
        left_s, eta = ended.created - at, int(m.group(4))
        if int(m.group(1)) <= 0.8 * EVENTS:
            assert eta >= 1, (eta, left_s, applied)
    growing = [n for n in seen if 0 < n < EVENTS]
    assert len(set(growing)) >= 3, seen  # /status shows the counts as they grow
    assert growing == sorted(growing)


async def test_a_poison_event_during_catch_up_is_named_and_retries_count_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catchup_progress, "EVERY_S", 0.5)
    url = f"sqlite:///{tmp_path}/e.db"
    await _fill(url, 3000, poison=1234)
    app = App("poison")
    failing = [True]

    @app.agent(app.topic("orders", partitions=2), tables=[COUNTS], history=FromEventStore())
    async def agent(event: Event, counts: TableView[int]) -> None:
        counts[event.stream_id or ""] = counts.get(event.stream_id or "", 0) + 1
        if event.type == "order.poison" and failing[0]:
            raise ValueError(f"cannot handle {event.id}")

    worker = _worker(app, url, tmp_path)
    with caplog.at_level(logging.INFO, logger="streamapp"):
        await worker.start()
        try:
            base = f"http://127.0.0.1:{worker.web_port}"
            async with aiohttp.ClientSession() as http:
                body: dict[str, Any] = {}
                stuck: list[dict[str, Any]] = []

                async def tried_thrice() -> bool:
                    _, answer = await _get(http, f"{base}/status")
                    body.clear()
                    body.update(answer)
                    stuck[:] = [p["stuck_on"] for p in body["partitions"].values() if p["stuck_on"]]
                    return bool(stuck) and stuck[0]["attempts"] >= 3

                def partitions() -> bytes:  # phases, positions, attempts
                    return frozen(body.get("partitions"))

                await until(
                    tried_thrice,
                    what="the poison event tried three times",
                    progress=partitions,
                    poll_s=0.2,
                    detail=lambda: body,
                )
                (record,) = stuck
                assert {k: record[k] for k in ("position", "stream_id", "version", "type")} == {
                    "position": 1234,
                    "stream_id": "s-34",
                    "version": 1234 // 50 + 1,
                    "type": "order.poison",
                }
                assert "cannot handle e1234" in record["last_error"]
                assert body["history"]["progress"]["eta_s"] is None  # no ETA while stuck
                status, ready = await _get(http, f"{base}/readyz")
                assert status == 503
                (name,) = ready["not_live"]
                assert ready["stuck_on"][name]["position"] == 1234
                assert "is stuck on store position 1234" in ready["stuck_on"][name]["message"]
                await until(  # a progress line while stuck
                    lambda: ", stuck" in caplog.text,
                    what="a progress line saying stuck",
                    progress=lambda: (len(caplog.records), partitions()),
                    detail=lambda: caplog.text[-3000:],
                )
                failing[0] = False  # fixed: the next attempt goes through

                async def ready() -> bool:
                    _, answer = await _get(http, f"{base}/status")
                    body.clear()
                    body.update(answer)
                    return (await _get(http, f"{base}/readyz"))[0] == 200

                await until(ready, what="ready once fixed", progress=partitions, poll_s=0.2)
                _, body = await _get(http, f"{base}/status")
                assert all(p["stuck_on"] is None for p in body["partitions"].values())
        finally:
            await worker.stop()
    text = caplog.text
    assert re.search(
        r"orders\[\d\] is stuck on store position 1234 \(stream 's-34' version 25, type "
        r"'order.poison'\) after \d+ failed attempts; last error: .*cannot handle e1234",
        text,
    ), text
    assert ", stuck" in text  # the progress line says stuck, not ETA 0s
    assert "caught up: 3000 events applied" in text  # re-reads of the retries count once


class _Member:
    """A catching-up member as progress reads it: a name, a topic, a store position and
    its replayed count, moved by the test."""

    def __init__(self, name: str, position: int = 1, partitions: int = 4) -> None:
        from streamapp.topics import TopicSpec

        self.name, self.topic, self.partition = name, TopicSpec("t", partitions), 0
        self.position, self.replayed = position, 0

    def history_position(self) -> int:
        return self.position

    def stuck(self, on: dict[str, object] | None) -> None:
        pass


class _Taken:
    def __init__(self, n: int) -> None:
        self.n = n

    def taken(self) -> int:
        return self.n


def _progress() -> catchup_progress.CatchUpProgress:
    progress = catchup_progress.CatchUpProgress(clock=lambda: 10.0)
    progress.bar = False
    return progress


def test_a_member_joining_at_the_head_has_nothing_left() -> None:
    """A build's last (fresh) read joins at the head: it adds nothing to the total (the
    old count took it from store position 1: '5435 of 25000 events (store head 20000)')."""
    progress = _progress()
    progress.head = 20_000
    members = [_Member(f"orders[{p}] (building v2)", position=20_001) for p in range(4)]
    for member in members:
        progress.join(member)  # type: ignore[arg-type]
    status = progress.status()
    assert (status["applied"], status["left"], status["total"]) == (0, 0, 0)
    lanes = status["lanes"]
    assert isinstance(lanes, list)
    assert {lane["store_position"] for lane in lanes} == {20_000}


def test_each_members_progress_only_grows_and_stays_within_the_head() -> None:
    progress = _progress()
    progress.head = 100
    member = _Member("orders[0]")
    progress.join(member)  # type: ignore[arg-type]
    seen: list[tuple[int, int, int]] = []

    def look() -> None:
        (lane,) = progress.lanes()
        applied, position, left = lane["applied"], lane["store_position"], lane["left"]
        assert isinstance(applied, int)
        assert isinstance(position, int)
        assert isinstance(left, int)
        seen.append((applied, position, left))
        assert position <= progress.head
        assert applied + left <= progress.head  # never more events than positions

    progress.chunk(member, rows=100, mine=100, left=100, end=101)  # type: ignore[arg-type]
    progress.applying(member, _Taken(40))  # type: ignore[arg-type]
    look()
    progress.applied(member)  # type: ignore[arg-type]
    member.replayed, member.position = 30, 31  # the part committed: less than was taken
    look()
    member.replayed, member.position = 100, 101
    progress.chunk(member, rows=100, mine=100, left=100, end=101)  # type: ignore[arg-type]
    look()
    applied = [a for a, _, _ in seen]
    positions = [p for _, p, _ in seen]
    assert applied == sorted(applied), seen
    assert positions == sorted(positions), seen
    assert seen[-1] == (100, 100, 0)


def test_a_stop_mid_catch_up_says_where_it_stopped_not_caught_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = _progress()
    progress.head = 500
    done, stopped = _Member("orders[0]"), _Member("orders[1] (building v2)")
    for member in (done, stopped):
        progress.join(member)  # type: ignore[arg-type]
    done.replayed, done.position = 125, 501
    stopped.replayed, stopped.position = 40, 161
    with caplog.at_level(logging.INFO, logger="streamapp.catchup"):
        progress.leave(done, caught_up=True)  # type: ignore[arg-type]
        progress.finish([stopped])  # type: ignore[list-item]
        assert "caught up" not in caplog.text  # one still catches up
        progress.finish([])  # the other's wait ended without its release: a stop
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("catch-up stopped: 165 events applied in "), line
    assert "orders[1] (building v2) at store position 160 (store head 500)" in line
    assert "caught up" not in line
