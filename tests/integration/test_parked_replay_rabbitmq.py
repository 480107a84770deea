"""``streamapp parked replay`` and ``streamapp dlq replay`` on real RabbitMQ: the parking
and dead-letter queues' messages go back to their origin exchange once the handler is
fixed, each once (acked when confirmed: a next run finds only what came since), without
the chain's and park headers, the CloudEvent and business headers intact; ``--dry-run``
sends nothing and leaves them queued; offsets are refused, naming the option.

What crossed the origin exchanges is read by a tap: a queue of the test's own bound to
them with every partition's routing key (the worker's queues are left alone). The app
is ``tests/apps/replay_app.py`` (events without ``streamversion``: a record sent twice
would be applied twice).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from streamapp import App, Event
from streamapp.codecs import amqp as codec
from streamapp.failures.republish import REPLAYED
from streamapp.topics import partition_for
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.wire import from_message
from tests.conftest import Services
from tests.support import waits
from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    read_table,
    streamapp_cmd,
    wait_ready,
    worker_progress,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.replay_app:app"
BUSINESS = ("tenant", b"acme")
OWN = ("x-reconsume", "x-retry-hop", "x-origin-topic", "x-retry-agent", "x-dlq-reason", "x-origin")
NO_KAFKA = "127.0.0.1:1"


@pytest.fixture
def amqp(services: Services) -> str:
    return services.amqp


def env(ns: str, amqp: str, **extra: str) -> dict[str, str]:
    return app_env(NO_KAFKA, ns, STREAMAPP_BROKER="rabbitmq", STREAMAPP_AMQP_URL=amqp, **extra)


def cli(ns: str, amqp: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(
        streamapp_cmd(*args, "-A", APP),
        env=env(ns, amqp),
        cwd=ROOT,
    )


def streams_on(partition: int, n: int, prefix: str) -> list[str]:
    found = [
        f"{prefix}{i}" for i in range(200) if partition_for(f"{prefix}{i}".encode(), 2) == partition
    ]
    return found[:n]


@asynccontextmanager
async def tap(amqp: str, exchange: str) -> AsyncIterator[list[tuple[Any, ...]]]:
    """``(key, value, headers)`` of every message routed to ``exchange`` while open."""
    seen: list[tuple[Any, ...]] = []
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        for p in range(2):
            await queue.bind(exchange, routing_key=str(p))

        async def received(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            seen.append(from_message(message.body, message.headers, message.content_type))
            await message.ack()

        await queue.consume(received)
        yield seen
    finally:
        await connection.close()


async def depth(amqp: str, topic: str) -> int:
    """Ready messages in ``topic``'s two partition queues."""
    connection = await aio_pika.connect(amqp)
    try:
        total = 0
        for p in range(2):
            channel = await connection.channel()
            declared = await channel.declare_queue(f"{topic}.{p}", passive=True)
            total += declared.declaration_result.message_count or 0
            await channel.close()
        return total
    finally:
        await connection.close()


async def until(check: Callable[[], Awaitable[bool]], what: str, worker: WorkerProc) -> None:
    """Until ``check()`` holds; fails once neither the worker's log nor its /status moved
    for a minute, or it died."""
    await waits.until(
        check,
        what=what,
        progress=lambda: worker_progress([worker]),
        poll_s=0.2,
        detail=lambda: worker.log_text()[-3000:],
    )


async def send(amqp: str, topic: str, events: list[Event]) -> None:
    settings = App("replay-test-sender", broker="rabbitmq", amqp_url=amqp).settings()
    sink = RabbitSink(settings, {topic: 2})
    await sink.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await sink.publish(topic, value, key=key, headers=[*headers, BUSINESS])
    finally:
        await sink.stop()


def id_of(message: tuple[Any, ...]) -> str:
    return str(dict(message[2])["cloudEvents_id"].decode())


def assert_back_as_sent(original: tuple[Any, ...], replayed: tuple[Any, ...], held: str) -> None:
    """Key, body and every header as first sent, and one more naming where it was held
    (a message of one of ``held``'s queues)."""
    assert replayed[:2] == original[:2]  # key and body
    (where,) = [v for n, v in replayed[2] if n == REPLAYED]
    assert where.startswith(f"queue {held}.".encode()), where
    kept = [h for h in replayed[2] if h[0] != REPLAYED]
    assert sorted(kept) == sorted(original[2])  # every header, nothing more
    names = [n for n, _ in kept]
    assert BUSINESS in replayed[2]
    assert not [n for n in names if n in OWN or n.startswith("streamapp-")], names


def topics_create(ns: str, amqp: str) -> None:
    made = run_watched(
        streamapp_cmd("topics", "create", "-A", APP),
        env=env(ns, amqp),
        cwd=ROOT,
    )
    assert made.returncode == 0, made.stderr


def run_worker(ns: str, amqp: str, tmp_path: Path, gate: Path) -> WorkerProc:
    topics_create(ns, amqp)
    return WorkerProc(
        NO_KAFKA,
        ns,
        tmp_path / "data",
        tmp_path / "w.log",
        app_ref=APP,
        extra_env={
            "STREAMAPP_BROKER": "rabbitmq",
            "STREAMAPP_AMQP_URL": amqp,
            "STREAMAPP_TEST_REPLAY_GATE": str(gate),
        },
    ).start()


async def settled(
    worker: WorkerProc, amqp: str, source: str, table_name: str, keys: list[str]
) -> dict[str, Any]:
    """The table once the source queues are drained and the worker is idle, twice alike."""
    last: dict[str, Any] | None = None
    table: dict[str, Any] = {}

    async def twice_alike() -> bool:
        nonlocal last
        status = await worker.status()
        idle = status is not None and not any(p["busy"] for p in status["partitions"].values())
        if idle and await depth(amqp, source) == 0:
            table.clear()
            table.update(await read_table([worker], table_name, keys))
            if table == last:
                return True
            last = dict(table)
        return False

    await until(twice_alike, "the worker settled", worker)
    return table


async def test_parked_messages_go_back_once(amqp: str, tmp_path: Path) -> None:
    ns = f"rpr{uuid.uuid4().hex[:6]}-"
    gate = tmp_path / "gate"
    gate.touch()
    source, parking = f"{ns}rp-park", f"{ns}rp-park.parked"
    gated = streams_on(0, 2, "g") + streams_on(1, 2, "g")
    good = streams_on(0, 1, "ok") + streams_on(1, 1, "ok")
    worker = run_worker(ns, amqp, tmp_path, gate)
    try:
        async with tap(amqp, source) as seen:
            events = [Event.create("gated", stream_id=s, data={}) for s in gated]
            events += [Event.create("fine", stream_id=s, data={}) for s in good]
            await send(amqp, source, events)

            async def parked_all() -> bool:
                assert worker.alive, worker.log_text()[-3000:]
                return await depth(amqp, parking) == 4

            await until(parked_all, "4 messages parked", worker)
            table = await settled(worker, amqp, source, "applied", gated + good)
            assert all(table[s] is None for s in gated)
            assert all(len(table[s]) == 1 for s in good)
            originals = {id_of(m): m for m in seen}
            assert len(originals) == 6
            gate.unlink()  # the handler is fixed

            offsets = cli(ns, amqp, "parked", "replay", "--topic", parking, "--from", "1")
            assert offsets.returncode == 1
            assert "--from: RabbitMQ queues have no offsets" in offsets.stderr
            dry = cli(ns, amqp, "parked", "replay", "--topic", parking, "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert "dry run: would send 4 records back" in dry.stdout, dry.stdout
            assert dry.stdout.count(f"would send queue {parking}.") == 4
            await until(lambda: _equals(depth(amqp, parking), 4), "the dry run's put back", worker)
            assert len(seen) == 6  # nothing sent

            run = cli(ns, amqp, "parked", "replay", "--topic", parking)
            assert run.returncode == 0, run.stderr
            assert f"sent 4 records back to their origin topic ({source}: 4)" in run.stdout
            assert await depth(amqp, parking) == 0  # each acked once confirmed
            again = cli(ns, amqp, "parked", "replay", "--topic", parking)
            assert again.returncode == 0, again.stderr
            assert "sent 0 records back" in again.stdout

            table = await settled(worker, amqp, source, "applied", gated + good)
            assert len(seen) == 10
        wanted = {id_of(m) for m in seen[6:]}
        assert {s: table[s] for s in gated} == {
            s: [i] for s in gated for i in wanted if originals[i][0] == s.encode()
        }
        assert all(len(table[s]) == 1 for s in good)
        for replayed in seen[6:]:
            assert_back_as_sent(originals[id_of(replayed)], replayed, parking)
        assert "sent back by a replay" not in worker.log_text()  # no versions, no guard
    finally:
        assert worker.stop() == 0


async def test_dead_letters_go_back_once(amqp: str, tmp_path: Path) -> None:
    ns = f"rpq{uuid.uuid4().hex[:6]}-"
    gate = tmp_path / "gate"
    gate.touch()
    source, dlq = f"{ns}rp-chain", f"{ns}rp-chain-dlq"
    gated = streams_on(0, 2, "d") + streams_on(1, 1, "d")
    worker = run_worker(ns, amqp, tmp_path, gate)
    try:
        async with tap(amqp, source) as seen:
            await send(amqp, source, [Event.create("gated", stream_id=s, data={}) for s in gated])

            async def dead_all() -> bool:
                assert worker.alive, worker.log_text()[-3000:]
                return await depth(amqp, dlq) == 3

            await until(dead_all, "3 messages dead-lettered", worker)
            originals = {id_of(m): m for m in seen}
            gate.unlink()
            run = cli(ns, amqp, "dlq", "replay", "--topic", dlq)
            assert run.returncode == 0, run.stderr
            assert f"sent 3 records back to their origin topic ({source}: 3)" in run.stdout
            assert await depth(amqp, dlq) == 0  # each acked once confirmed
            table = await settled(worker, amqp, source, "chained", gated)
            assert len(seen) == 6
        assert {s: table[s] for s in gated} == {m[0].decode(): [id_of(m)] for m in seen[:3]}
        for replayed in seen[3:]:
            assert_back_as_sent(originals[id_of(replayed)], replayed, dlq)
    finally:
        assert worker.stop() == 0


async def test_a_message_whose_stream_moved_on_is_skipped_with_a_warning(
    amqp: str, tmp_path: Path
) -> None:
    """A parked event (stream version 1) whose stream applied version 2 meanwhile is
    skipped by stream version when sent back: the worker logs a WARNING naming the
    parked message, the stream and both versions; a stream that did not move on
    applies its event without one."""
    ns = f"rpm{uuid.uuid4().hex[:6]}-"
    gate = tmp_path / "gate"
    gate.touch()
    source, parking = f"{ns}rp-park", f"{ns}rp-park.parked"
    moved, kept = streams_on(0, 2, "mv")
    failed = Event.create("gated", stream_id=moved, data={}, version=1)
    alone = Event.create("gated", stream_id=kept, data={}, version=1)
    later = Event.create("fine", stream_id=moved, data={}, version=2)
    worker = run_worker(ns, amqp, tmp_path, gate)
    try:
        await wait_ready(worker)
        await send(amqp, source, [failed, alone, later])

        async def parked_both() -> bool:
            assert worker.alive, worker.log_text()[-3000:]
            return await depth(amqp, parking) == 2

        await until(parked_both, "2 messages parked", worker)
        table = await settled(worker, amqp, source, "applied", [moved, kept])
        assert table == {moved: [later.id], kept: None}
        gate.unlink()
        run = cli(ns, amqp, "parked", "replay", "--topic", parking)
        assert run.returncode == 0, run.stderr
        assert f"sent 2 records back to their origin topic ({source}: 2)" in run.stdout

        def warned() -> list[str]:
            log = worker.log_text().splitlines()
            return [line for line in log if "by a replay" in line]

        async def applied_kept() -> bool:
            assert worker.alive, worker.log_text()[-3000:]
            got = await read_table([worker], "applied", [kept])
            return got[kept] == [alone.id]

        await until(applied_kept, f"the event of {kept} applied", worker)
        table = await settled(worker, amqp, source, "applied", [moved, kept])
        assert table == {moved: [later.id], kept: [alone.id]}  # moved misses it
        (line,) = warned()
        for part in (
            "WARNING",
            f"agent park_ids skipped queue {parking}.",
            f"its stream {moved!r} moved on",
            "the event is stream version 1",
            "table applied has applied the stream through version 2",
            "streamapp reset -A MODULE:app --agent park_ids --yes",
        ):
            assert part in line, (part, line)
    finally:
        assert worker.stop() == 0


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_an_unconfirmed_record_stops_the_run_and_stays_parked(
    amqp: str, tmp_path: Path
) -> None:
    """A record its origin cannot take (no queue bound: returned, not confirmed) stops
    the run with exit 1 naming it and the count sent before it; it and those after it
    stay parked, and the next run, once the queue is back, sends them."""
    ns = f"rpf{uuid.uuid4().hex[:6]}-"
    gate = tmp_path / "gate"
    gate.touch()
    source, parking = f"{ns}rp-park", f"{ns}rp-park.parked"
    gated = streams_on(0, 2, "g") + streams_on(1, 2, "g")
    worker = run_worker(ns, amqp, tmp_path, gate)
    try:
        await send(amqp, source, [Event.create("gated", stream_id=s, data={}) for s in gated])

        async def parked_all() -> bool:
            assert worker.alive, worker.log_text()[-3000:]
            return await depth(amqp, parking) == 4

        await until(parked_all, "4 messages parked", worker)
    finally:
        assert worker.stop() == 0
    gate.unlink()
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        await channel.queue_delete(f"{source}.1")  # partition 1's records come back returned
    finally:
        await connection.close()

    failed = cli(ns, amqp, "parked", "replay", "--topic", parking)
    assert failed.returncode == 1, failed.stdout
    assert "sent 2 records back before stopping" in failed.stderr
    assert f"record queue {parking}.1 message 1 was not confirmed" in failed.stderr
    assert "returned unroutable" in failed.stderr
    assert await depth(amqp, parking) == 2  # the unconfirmed one and the one after it

    topics_create(ns, amqp)
    rest = cli(ns, amqp, "parked", "replay", "--topic", parking)
    assert rest.returncode == 0, rest.stderr
    assert f"sent 2 records back to their origin topic ({source}: 2)" in rest.stdout
    worker = run_worker(ns, amqp, tmp_path, gate)
    try:
        await wait_ready(worker)
        table = await settled(worker, amqp, source, "applied", gated)
        assert all(table[s] is not None and len(table[s]) == 1 for s in gated), table
    finally:
        assert worker.stop() == 0
