"""Helpers for integration tests: worker processes, order events, lag and view checks.

Everything here talks to real services; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import Event
from streamapp.codecs import kafka as codec
from tests.support.records import read_to_end
from tests.support.services import restart_service as restart_service  # moved there
from tests.support.waits import STALLED_S, frozen, run_watched, until, until_exit

ROOT = Path(__file__).resolve().parents[2]


STATUSES = ("placed", "paid", "shipped", "cancelled")


def around_traceback(text: str, before: int = 1500, after: int = 3500) -> str:
    """The part of a log around its first ``Traceback``: what a failed "no traceback"
    assertion must show (the log's tail rarely holds it)."""
    at = text.find("Traceback")
    return text[-3000:] if at < 0 else text[max(0, at - before) : at + after]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def app_env(bootstrap: str, namespace: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        STREAMAPP_KAFKA_BOOTSTRAP=bootstrap,
        ORDERS_NAMESPACE=namespace,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    # A forwarder serves its metrics on a free port: tests (and parallel runs) start
    # several on one machine, where the default 6067 would be taken.
    env.setdefault("STREAMAPP_FORWARDER_WEB_PORT", "0")
    env.update(extra)
    return env


def streamapp_cmd(*args: str, launcher: str = "streamapp.cli") -> list[str]:
    return [sys.executable, "-m", launcher, *args]


def create_topics(bootstrap: str, namespace: str, app_ref: str = "agents.orders:app") -> str:
    out = run_watched(
        streamapp_cmd("topics", "create", "-A", app_ref),
        env=app_env(bootstrap, namespace),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@dataclass
class WorkerProc:
    """One ``streamapp worker`` process of the orders app."""

    bootstrap: str
    namespace: str
    data_dir: Path
    log_path: Path
    app_ref: str = "agents.orders:app"
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    wrapper: list[str] = field(default_factory=list)
    """A command the worker runs under (e.g. ``faketime -f +90s``)."""
    launcher: str = "streamapp.cli"
    """The module run as the CLI (``tests.support.crashpoint``: with a crash point)."""
    loglevel: str = "info"
    """``-l``: ``debug`` adds the per-partition lines (``caught up at store position``)."""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProc:
        self.extra_env.setdefault(
            "STREAMAPP_EVENT_STORE", f"sqlite:///{self.data_dir.parent / 'events.db'}"
        )
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.wrapper
            + streamapp_cmd(
                "worker",
                "-A",
                self.app_ref,
                "--data-dir",
                str(self.data_dir),
                "--web-port",
                str(self.port),
                "-l",
                self.loglevel,
                launcher=self.launcher,
            ),
            env=app_env(self.bootstrap, self.namespace, **self.extra_env),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def stop(self, stalled_s: float = STALLED_S) -> int:
        """SIGTERM and wait: the worker must exit by itself (:meth:`wait_exit`)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(stalled_s)

    def wait_exit(self, stalled_s: float = STALLED_S) -> int:
        """Until the worker has exited: its exit code. Fails, with its log's tail, once it
        neither exited nor logged anything for ``stalled_s`` (a worker logs its start,
        each start-up retry, each partition it closes, its closing)."""
        assert self.proc is not None
        return until_exit(
            self.proc,
            what=f"worker on port {self.port} exited",
            progress=self.log_size,
            stalled_s=stalled_s,
            detail=lambda: self.log_text()[-3000:],
        )

    async def exited(self, stalled_s: float = STALLED_S) -> int:
        """:meth:`wait_exit` for a worker at work (it exits by itself: a crash point), the
        event loop going on meanwhile: its /status partitions (positions, counts) are
        progress too, beside its log."""
        assert self.proc is not None
        proc = self.proc

        async def progress() -> tuple[int, bytes]:
            return self.log_size(), partitions_of([await self.status()])

        (code,) = await until(
            lambda: None if proc.poll() is None else (proc.returncode,),
            what=f"worker on port {self.port} exited",
            progress=progress,
            stalled_s=stalled_s,
            poll_s=0.2,
            detail=lambda: self.log_text()[-3000:],
        )
        return int(code)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_size(self) -> int:
        """The log's size in bytes: it grows while the worker starts, connects, restores."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    @property
    def auth(self) -> dict[str, str]:
        """The bearer header of this worker's views (when it has a token)."""
        token = self.extra_env.get("STREAMAPP_WEB_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def status(self) -> dict[str, Any] | None:
        try:
            async with (
                aiohttp.ClientSession(headers=self.auth) as http,
                http.get(
                    f"http://127.0.0.1:{self.port}/status", timeout=aiohttp.ClientTimeout(total=2)
                ) as r,
            ):
                body: dict[str, Any] = await r.json()
                return body
        except (TimeoutError, aiohttp.ClientError):
            return None


def order_events(
    n_orders: int, n_events: int, seed: int = 7, *, versioned: bool = False
) -> tuple[list[Event], dict[str, tuple[int, str]]]:
    """``n_events`` order events over ``n_orders`` orders; expected (count, last status).
    ``versioned``: each event carries its ``streamversion`` (1, 2, ... per order), so the
    per-key stream-version guard skips a repeat."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    last: dict[str, str] = {}
    events = []
    for i in range(n_events):
        oid = (
            f"order-{i % n_orders:05d}" if i < n_orders else f"order-{rng.randrange(n_orders):05d}"
        )
        status = "placed" if oid not in counts else rng.choice(STATUSES[1:])
        counts[oid] = counts.get(oid, 0) + 1
        last[oid] = status
        events.append(
            Event.create(
                f"order.{status}",
                stream_id=oid,
                source="tests",
                data={"order": oid, "n": i},
                version=counts[oid] if versioned else None,
            )
        )
    return events, {oid: (counts[oid], last[oid]) for oid in counts}


async def produce(
    bootstrap: str,
    topic: str,
    events: list[Event],
    *,
    rate: float | None = None,
    structured: frozenset[str] = frozenset(),
) -> None:
    """Publish ``events`` in binary mode with ``acks=all`` (those whose id is in
    ``structured`` in structured mode); ``rate`` caps events per second."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        started = time.monotonic()
        futures = []
        for i, event in enumerate(events):
            encode = codec.encode_structured if event.id in structured else codec.encode
            key, value, headers = encode(event)
            futures.append(await producer.send(topic, value, key=key, headers=headers))
            if rate is not None and i % 500 == 499:
                ahead = (i + 1) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def lag(bootstrap: str, group: str, topic: str) -> int:
    """Records of ``topic`` not yet committed by ``group`` (committed = durable in tables)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        (described,) = await admin.describe_topics([topic])
        tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
        assert tps, f"topic {topic} has no partitions"
        ends = await consumer.end_offsets(tps)
        total = 0
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            total += ends[tp] - done
        return total
    finally:
        await consumer.stop()
        await admin.close()


async def wait_caught_up(
    bootstrap: str, group: str, topic: str, stalled_s: float, workers: list[WorkerProc]
) -> None:
    """Until ``group`` has committed all of ``topic`` and no worker is in a batch; fails
    once neither the lag nor the workers' partitions (events processed, positions) moved
    for ``stalled_s``, or a worker dies."""
    seen: dict[str, Any] = {"lag": -1, "statuses": []}

    async def check() -> bool:
        alive(workers)
        seen["lag"] = await lag(bootstrap, group, topic)
        seen["statuses"] = [await w.status() for w in workers]
        return seen["lag"] == 0 and _idle(seen["statuses"])

    await until(
        check,
        what=f"group {group} caught up on {topic}",
        progress=lambda: (seen["lag"], partitions_of(seen["statuses"])),
        stalled_s=stalled_s,
        poll_s=0.5,
        detail=lambda: f"{seen['lag']} records behind",
    )


def _idle(statuses: list[dict[str, Any] | None]) -> bool:
    """No partition of the workers is in a batch: what their views read is at rest."""
    return all(
        s is not None and not any(p["busy"] for p in s["partitions"].values()) for s in statuses
    )


def alive(workers: list[WorkerProc], what: str = "") -> None:
    """Fail at once, with its log's tail, when a worker has exited."""
    for w in workers:
        assert w.alive, (
            f"worker died{what and f' while waiting for {what}'}:\n{w.log_text()[-3000:]}"
        )


def partitions_of(statuses: list[dict[str, Any] | None]) -> bytes:
    """The progress of the workers' /status answers: their ready flags and partitions
    (phases, positions, counts), nothing that changes with the clock alone."""
    return frozen(
        [
            None if s is None else (s.get("ready"), s.get("rebalancing"), s["partitions"])
            for s in statuses
        ]
    )


async def worker_progress(workers: list[WorkerProc]) -> tuple[object, ...]:
    """What moves while workers work, for a wait's ``progress``: their logs' sizes and
    their /status partitions (phases, positions, counts); it fails at once, with the log's
    tail, when a worker has exited."""
    alive(workers)
    statuses = [await w.status() for w in workers]
    return tuple(w.log_size() for w in workers), partitions_of(statuses)


async def wait_ready(worker: WorkerProc, stalled_s: float = 60.0) -> dict[str, Any]:
    """Until the worker serves /status with every assigned partition ready; fails once
    neither its log nor its /status (partitions, phases, counts restored and replayed)
    moved for ``stalled_s``, or it died."""
    seen: list[dict[str, Any] | None] = [None]

    async def check() -> dict[str, Any] | None:
        alive([worker])
        seen[0] = status = await worker.status()
        return status if status and status["partitions"] and status["ready"] else None

    ready: dict[str, Any] = await until(
        check,
        what=f"worker on port {worker.port} ready",
        progress=lambda: (worker.log_size(), partitions_of(seen)),
        stalled_s=stalled_s,
        poll_s=0.3,
        detail=lambda: f"{seen[0]}\n{worker.log_text()[-3000:]}",
    )
    return ready


async def wait_group_ready(
    workers: list[WorkerProc], partitions: int, stalled_s: float = 90.0
) -> None:
    """Until the workers together own ``partitions`` partitions, all ready, in one look;
    fails once neither their logs nor their /status answers moved for ``stalled_s``."""
    seen: list[dict[str, Any] | None] = []

    async def check() -> bool:
        seen[:] = [await w.status() for w in workers]
        ready = [s for s in seen if s and s["ready"] and s["partitions"]]
        return len(ready) == len(workers) and sum(len(s["partitions"]) for s in ready) == partitions

    await until(
        check,
        what=f"{len(workers)} workers ready together on {partitions} partitions",
        progress=lambda: (tuple(w.log_size() for w in workers), partitions_of(seen)),
        stalled_s=stalled_s,
        poll_s=0.3,
        detail=lambda: seen,
    )


async def read_table(workers: list[WorkerProc], table: str, keys: list[str]) -> dict[str, Any]:
    """Each key's value, asked of every worker: exactly one serves it from its own state;
    the others forward to it (same answer) or, without a members topic, answer 421."""
    out: dict[str, Any] = {}
    sem = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:

        async def ask(w: WorkerProc, key: str) -> tuple[int, Any, bool]:
            async def answer() -> tuple[int, Any, bool] | None:
                async with http.get(
                    f"http://127.0.0.1:{w.port}/tables/{table}/{key}", headers=w.auth
                ) as r:
                    if r.status != 503:
                        forwarded = "X-Streamapp-Forwarded-To" in r.headers
                        return r.status, await r.json(), forwarded
                    assert r.headers["Retry-After"]
                    return None

            async def progress() -> bytes:
                return partitions_of([await w.status()])

            # honour Retry-After while the worker restores or rebalances (it moves)
            what = f"{key} answered by port {w.port}, not 503"
            answered: tuple[int, Any, bool] = await until(
                answer, what=what, progress=progress, stalled_s=60, poll_s=0.2
            )
            return answered

        async def one(key: str) -> None:
            local: list[tuple[int, Any]] = []
            forwarded: list[tuple[int, Any]] = []
            async with sem:
                for w in workers:
                    status, body, was_forwarded = await ask(w, key)
                    if status == 421:
                        continue
                    assert status in (200, 404), (status, body)
                    (forwarded if was_forwarded else local).append((status, body))
            assert len(local) == 1, f"{key}: owners answered {local}"
            assert all(answer == local[0] for answer in forwarded), (key, local, forwarded)
            status, body = local[0]
            out[key] = body if status == 200 else None

        await asyncio.gather(*(one(k) for k in keys))
    return out


def assert_exact(table: dict[str, Any], expected: dict[str, tuple[int, str]]) -> None:
    wrong = {
        oid: (table.get(oid), exp)
        for oid, exp in expected.items()
        if table.get(oid) is None or (table[oid]["version"], table[oid]["status"]) != exp
    }
    assert not wrong, f"{len(wrong)} orders wrong, e.g. {list(wrong.items())[:5]}"


def exact(table: dict[str, Any], expected: dict[str, tuple[int, str]]) -> bool:
    """Whether ``table`` has every order of ``expected`` at its (count, last status)."""
    return all(
        table.get(oid) is not None and (table[oid]["version"], table[oid]["status"]) == exp
        for oid, exp in expected.items()
    )


async def wait_exact(
    workers: list[WorkerProc],
    expected: dict[str, tuple[int, str]],
    name: str = "order_status",
    stalled_s: float = 60.0,
) -> dict[str, Any]:
    """Until table ``name`` (read from every worker) is exact (:func:`assert_exact`);
    fails, showing what is wrong, once its values stood still for ``stalled_s``. A read
    that finds a key with no single owner (it moves in a rebalance) is read again."""
    table: dict[str, Any] = {}
    moving: list[str] = []

    async def check() -> bool:
        try:
            table.update(await read_table(workers, name, list(expected)))
        except AssertionError as exc:  # owners answered otherwise than once
            moving[:] = [str(exc)]
            return False
        moving.clear()
        return exact(table, expected)

    try:
        await until(
            check,
            what=f"{name} exact",
            progress=lambda: frozen(table),
            stalled_s=stalled_s,
            poll_s=0.3,
            detail=lambda: moving,
        )
    except AssertionError:
        assert_exact(table, expected)  # what is wrong
        raise
    return table


@dataclass
class StreamappProc:
    """Any ``streamapp`` command as a process of the orders app (e.g. the forwarder)."""

    args: tuple[str, ...]
    bootstrap: str
    namespace: str
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StreamappProc:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            streamapp_cmd(*self.args),
            env=app_env(self.bootstrap, self.namespace, **self.extra_env),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_size(self) -> int:
        """The log's size in bytes: it grows while the command works."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0


async def append_to_store(url: str, events: list[Event], chunk: int = 2000) -> None:
    """Append ``events`` to the event store at ``url``, each to its own stream."""
    from streamapp.eventstore import Append, open_store

    store = await open_store(url)
    try:
        for i in range(0, len(events), chunk):
            batch = [Append(e.stream_id or "", [e]) for e in events[i : i + chunk]]
            result = await store.append_many(batch)
            assert result.error is None, result.error
    finally:
        await store.close()


async def compacted_changelog(bootstrap: str, prefix: str) -> TopicPartition:
    """A fresh one-partition compacted topic, as a changelog is: its only partition."""
    import uuid

    from aiokafka.admin import NewTopic

    topic = f"{prefix}{uuid.uuid4().hex[:8]}-changelog"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        compact = {"cleanup.policy": "compact"}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=compact)])
    finally:
        await admin.close()
    return TopicPartition(topic, 0)


async def topic_partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic`` as the broker describes it (at least one)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    assert tps, f"topic {topic} has no partitions"
    return tps


async def topic_size(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (sum of end offsets; no transactions on source topics)."""
    from aiokafka import AIOKafkaConsumer

    tps = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def read_topic(bootstrap: str, topic: str, *, committed: bool = True) -> list[Any]:
    """Every committed record of ``topic`` (read_committed; every record written, aborted
    or not, unless ``committed`` is False), from each partition's start to its end as it
    is now (a parking destination: streamapp parks transactionally), by partition and
    offset. The read fails once no partition's position moved for a minute."""
    from aiokafka import AIOKafkaConsumer

    tps = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    await consumer.start()
    try:
        return await read_to_end(consumer, tps)
    finally:
        await consumer.stop()


class Proxy:
    """A TCP proxy in front of a service (RabbitMQ, PostgreSQL) whose connections a test
    can cut, at once (:meth:`cut`) or at the server's next reply (:meth:`cut_at_reply`)."""

    def __init__(self, host: str, port: int, *, amqp: bool = False) -> None:
        self.host, self.port, self.amqp = host, port, amqp
        """``amqp``: the server's replies are AMQP 0-9-1 frames (:attr:`confirms_held`)."""
        self.pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: asyncio.Server | None = None
        self._cut_at_reply = False
        self.replies_dropped = 0
        self.confirms_held: set[int] = set()
        """Connections (by the order they were accepted) whose AMQP publisher confirms
        (``basic.ack`` / ``basic.nack`` from the broker) are dropped; everything else,
        heartbeats included, still flows."""
        self.confirms_dropped = 0
        self.accepted = 0
        """Connections accepted so far (the next one's index in :attr:`confirms_held`)."""

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.pairs.append((writer, up_writer))
        index, self.accepted = self.accepted, self.accepted + 1
        frames = bytearray()

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, reply: bool) -> None:
            try:
                while data := await r.read(65536):
                    if reply and self._cut_at_reply:  # the request went through; its
                        self._cut_at_reply = False  # answer is lost with the connection
                        self.replies_dropped += 1
                        self.cut()
                        return
                    if reply and self.amqp:
                        frames.extend(data)
                        data = self._without_confirms(frames, index in self.confirms_held)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    def _without_confirms(self, frames: bytearray, hold: bool) -> bytes:
        """The whole AMQP frames at the head of ``frames`` (consumed), without the
        broker's ``basic.ack`` (60, 80) and ``basic.nack`` (60, 120) when ``hold``."""
        out = bytearray()
        while len(frames) >= 7:
            size = int.from_bytes(frames[3:7], "big")
            if len(frames) < size + 8:
                break
            frame, frames[:] = bytes(frames[: size + 8]), frames[size + 8 :]
            method = frame[0] == 1 and frame[7:11] in (b"\x00\x3c\x00\x50", b"\x00\x3c\x00\x78")
            if hold and method:
                self.confirms_dropped += 1
                continue
            out += frame
        return bytes(out)

    def cut_at_reply(self) -> None:
        """Let the next request reach the server, then drop its reply and cut every
        connection: the client cannot know whether the server acted on it."""
        self._cut_at_reply = True

    def cut(self) -> None:
        """Drop every connection at once, as a network failure would."""
        for a, b in self.pairs:
            a.transport.abort()
            b.transport.abort()
        self.pairs.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def wait_statuses(
    workers: list[WorkerProc],
    seen: Callable[[list[dict[str, Any]]], bool],
    what: str,
    stalled_s: float = 90.0,
) -> list[dict[str, Any]]:
    """Until ``seen`` holds for the workers' /status answers (in order), polled every
    0.1 s; their statuses then. Fails naming ``what`` if a worker dies or their
    partitions (phases, positions, counts) stood still for ``stalled_s``."""
    last: list[dict[str, Any]] = []

    async def check() -> list[dict[str, Any]] | None:
        alive(workers, what)
        last[:] = [await w.status() or {"partitions": {}, "ready": False} for w in workers]
        return list(last) if seen(last) else None

    statuses: list[dict[str, Any]] = await until(
        check,
        what=what,
        progress=lambda: partitions_of(list(last)),
        stalled_s=stalled_s,
        poll_s=0.1,
        detail=lambda: last,
    )
    return statuses


def processed(status: dict[str, Any]) -> int:
    """Events the worker's partitions processed since it started (its /status)."""
    return sum(int(p["processed"]) for p in status["partitions"].values())
