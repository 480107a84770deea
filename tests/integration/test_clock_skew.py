"""Clock skew between Kafka workers: ownership follows the group's generation.

Three workers of the orders app, one of them under ``faketime -f +90s`` (its wall clock
90 s ahead, monotonic time untouched). The skewed worker owns partitions and the others
forward to it; then it is SIGKILLed (or frozen with SIGSTOP past the session timeout).
Once the group has rebalanced, every key answers its exact value from a live owner, and
no answer names the lost worker: a record of an older generation is never routed to,
whatever its clock said. A frozen worker that wakes rejoins and answers exactly too.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamapp.versions.ledger import PREFIX as LEDGER_PREFIX
from tests.support import waits

from .harness import (
    WorkerProc,
    create_topics,
    free_port,
    order_events,
    produce,
    wait_caught_up,
    wait_group_ready,
)

# serial: it takes a shared service down, freezes a process or skews a clock (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

SKEW_S = 90
SESSION_TIMEOUT_MS = 6000
CONVERGE_MARGIN_S = 30.0
"""Beyond the session timeout: the rebalance, changelog restores, records to be read."""
N_ORDERS = 400
PARTITIONS = 8


def faketime(skew_s: int) -> list[str]:
    """The command prefix that skews a process's wall clock (never skipped: fails loudly)."""
    path = shutil.which("faketime")
    assert path is not None, (
        "faketime is not installed (Debian package `faketime`, libfaketime): scripts/test "
        "installs it; by hand: apt-get install faketime"
    )
    return [path, "-f", f"+{skew_s}s"]


class SkewedWorker(WorkerProc):
    """A worker under ``faketime``, which forks: signals go to the worker itself."""

    def _worker_pid(self) -> int | None:
        assert self.proc is not None
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            children = path.read_text().split()
        except OSError:  # faketime has exited
            return None
        return int(children[0]) if children else None

    def _signal(self, sig: signal.Signals) -> None:
        pid = self._worker_pid()
        if pid is not None:
            os.kill(pid, sig)

    def stop(self, stalled_s: float = waits.STALLED_S) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self._signal(signal.SIGCONT)  # in case it is frozen
            self._signal(signal.SIGTERM)  # faketime waits for it, then exits
        return self.wait_exit(stalled_s)

    def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.proc is not None
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def first_log_time(worker: WorkerProc) -> float:
    """The wall-clock time of the worker's first JSON log line (its own clock)."""
    for line in worker.log_text().splitlines():
        if line.startswith("{"):
            return datetime.fromisoformat(json.loads(line)["time"]).timestamp()
    raise AssertionError(f"no JSON log line yet:\n{worker.log_text()[-2000:]}")


class Answers:
    """Every key asked of a set of workers: what came back."""

    def __init__(self) -> None:
        self.exact = 0
        self.unavailable: list[str] = []
        self.wrong: list[Any] = []
        self.forwarded_to: dict[str, int] = {}


async def ask_all(
    http: aiohttp.ClientSession,
    workers: list[WorkerProc],
    expected: dict[str, tuple[int, str]],
) -> Answers:
    answers = Answers()
    sem = asyncio.Semaphore(32)

    async def ask(w: WorkerProc, key: str) -> None:
        async with sem, http.get(f"http://127.0.0.1:{w.port}/tables/order_status/{key}") as r:
            body: Any = await r.json()
            if r.status == 503:
                assert r.headers["Retry-After"]
                answers.unavailable.append(str(body))
                return
            value = (body.get("version"), body.get("status")) if r.status == 200 else None
            if value != expected[key]:
                answers.wrong.append((w.port, key, r.status, body))
                return
            answers.exact += 1
            owner = r.headers.get("X-Streamapp-Forwarded-To")
            if owner is not None:
                answers.forwarded_to[owner] = answers.forwarded_to.get(owner, 0) + 1

    await asyncio.gather(*(ask(w, k) for w in workers for k in expected))
    return answers


@dataclass
class SkewedGroup:
    """Two workers and a skewed one, with orders projected and forwarded to it."""

    live: list[WorkerProc]
    skewed: SkewedWorker
    expected: dict[str, tuple[int, str]]
    routed_to_skewed: int

    @property
    def skewed_url(self) -> str:
        return f"http://127.0.0.1:{self.skewed.port}"


@asynccontextmanager
async def skewed_group(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[SkewedGroup]:
    ns = f"skew{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    env = {
        "STREAMAPP_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "STREAMAPP_HEARTBEAT_INTERVAL_MS": "1000",
        "STREAMAPP_LOG_FORMAT": "json",
    }

    def worker(name: str) -> WorkerProc:
        return WorkerProc(
            kafka_bootstrap, ns, tmp_path / name, tmp_path / f"{name}.log", extra_env=dict(env)
        )

    live = [worker("a"), worker("b")]
    skewed = SkewedWorker(
        kafka_bootstrap,
        ns,
        tmp_path / "skewed",
        tmp_path / "skewed.log",
        extra_env={**env, "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
        wrapper=faketime(SKEW_S),
    )
    workers = [*live, skewed]
    for w in workers:
        w.start()
    try:
        await wait_group_ready(workers, PARTITIONS)
        skew = first_log_time(skewed) - first_log_time(live[0])
        assert skew > SKEW_S - 30, f"the skewed worker's clock is only {skew:.0f}s ahead"
        events, expected = order_events(N_ORDERS, 3 * N_ORDERS)
        await produce(kafka_bootstrap, topic, events)
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, workers)
        status = await skewed.status()
        assert status is not None
        assert status["partitions"], status  # it owns some
        group = SkewedGroup(live, skewed, expected, 0)
        async with aiohttp.ClientSession() as http:
            before = await ask_all(http, live, expected)
        assert not before.wrong, before.wrong[:5]
        assert not before.unavailable, before.unavailable[:5]
        group.routed_to_skewed = before.forwarded_to.get(group.skewed_url, 0)
        assert group.routed_to_skewed > 0, before.forwarded_to
        yield group
    finally:
        for w in workers:
            if w.alive:
                w.stop()


async def converge(
    http: aiohttp.ClientSession, group: SkewedGroup, lost_at: float
) -> tuple[int, int]:
    """Ask every key of the live workers until all are exact; no answer may name the
    skewed worker (the group has rebalanced). Passes and 503s until then."""
    passes, retried = 0, 0
    deadline = lost_at + SESSION_TIMEOUT_MS / 1000 + CONVERGE_MARGIN_S
    while True:
        passes += 1
        answers = await ask_all(http, group.live, group.expected)
        assert not answers.wrong, answers.wrong[:5]
        named = [a for a in answers.unavailable if group.skewed_url in a]
        assert not named, f"{len(named)} answers named the lost worker, e.g. {named[:2]}"
        assert group.skewed_url not in answers.forwarded_to, answers.forwarded_to
        retried += len(answers.unavailable)
        if answers.exact == len(group.live) * N_ORDERS:
            return passes, retried
        assert time.monotonic() < deadline, (
            f"{len(answers.unavailable)} keys still 503 {time.monotonic() - lost_at:.1f}s "
            f"after the worker was lost, e.g. {answers.unavailable[:2]}"
        )
        await asyncio.sleep(0.2)


async def test_a_dead_worker_with_a_fast_clock_is_never_routed_to(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async with skewed_group(kafka_bootstrap, tmp_path) as group, aiohttp.ClientSession() as http:
        group.skewed.kill()
        killed = time.monotonic()
        await wait_group_ready(group.live, PARTITIONS, stalled_s=SESSION_TIMEOUT_MS / 1000 + 60)
        rebalanced = time.monotonic() - killed
        passes, retried = await converge(http, group, killed)
        converged = time.monotonic() - killed
        again = await ask_all(http, group.live, group.expected)  # and it stays so
        assert again.exact == len(group.live) * N_ORDERS, (again.unavailable[:3], again.wrong[:3])
    print(
        f"clock skew, kill: rebalanced {rebalanced:.1f}s after the kill, every key exact from "
        f"a live owner after {converged:.1f}s ({passes} passes, {retried} 503s meanwhile, "
        f"none naming the dead worker); before it, {group.routed_to_skewed} answers came "
        "from the skewed worker"
    )


async def test_a_frozen_worker_with_a_fast_clock_is_not_routed_to_until_it_rejoins(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async with skewed_group(kafka_bootstrap, tmp_path) as group, aiohttp.ClientSession() as http:
        group.skewed.freeze()
        frozen = time.monotonic()
        await wait_group_ready(group.live, PARTITIONS, stalled_s=SESSION_TIMEOUT_MS / 1000 + 60)
        rebalanced = time.monotonic() - frozen
        passes, retried = await converge(http, group, frozen)
        converged = time.monotonic() - frozen
        group.skewed.thaw()
        thawed = time.monotonic()
        everyone = [*group.live, group.skewed]
        await wait_group_ready(everyone, PARTITIONS, stalled_s=SESSION_TIMEOUT_MS / 1000 + 60)
        deadline = time.monotonic() + CONVERGE_MARGIN_S
        while True:
            answers = await ask_all(http, everyone, group.expected)
            assert not answers.wrong, answers.wrong[:5]
            if answers.exact == len(everyone) * N_ORDERS:
                break
            assert time.monotonic() < deadline, answers.unavailable[:3]
            await asyncio.sleep(0.2)
        rejoined = time.monotonic() - thawed
    print(
        f"clock skew, freeze: rebalanced {rebalanced:.1f}s after SIGSTOP, every key exact "
        f"from a live owner after {converged:.1f}s ({passes} passes, {retried} 503s, none "
        f"naming the frozen worker); after SIGCONT all three exact again in {rejoined:.1f}s"
    )


async def members_records(bootstrap: str, topic: str, workers: int) -> list[dict[str, Any]]:
    """The last record of each worker in the members ``topic``, once ``workers`` of them
    claim partitions under one generation."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: dict[bytes, dict[str, Any]] = {}

        async def settled() -> bool:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for r in batch:
                    ledger = r.key is not None and r.key.startswith(LEDGER_PREFIX.encode())
                    if r.key is not None and r.value is not None and not ledger:
                        records[r.key] = json.loads(r.value)
            generations = {rec.get("generation") for rec in records.values()}
            return len(records) == workers and len(generations) == 1

        await waits.until(
            settled,
            what=f"{workers} members records under one generation",
            progress=lambda: waits.frozen({k.decode(): v for k, v in records.items()}),
            detail=lambda: records,
        )
        return list(records.values())
    finally:
        await consumer.stop()


async def test_a_record_of_a_worker_not_in_the_group_is_not_routed_to(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A leftover record that claims partitions under the current generation number (a
    group made again after a reset counts from 1 again) names no current member of the
    group: the live owner is still found, every key answers exactly, no 503."""
    ns = f"ghost{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    workers = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log").start()
        for n in ("a", "b")
    ]
    try:
        await wait_group_ready(workers, PARTITIONS)
        events, expected = order_events(N_ORDERS, 2 * N_ORDERS)
        await produce(kafka_bootstrap, topic, events)
        await wait_caught_up(kafka_bootstrap, topic, topic, 120, workers)
        records = await members_records(kafka_bootstrap, f"{topic}-members", len(workers))
        ghost_url = f"http://127.0.0.1:{free_port()}"
        ghost = {
            "worker": "ghost:1",
            "url": ghost_url,
            "generation": records[0]["generation"],
            "member_id": "aiokafka-0.14.0-ghost",
            "partitions": [[topic, p] for p in range(PARTITIONS)],
        }
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(
                f"{topic}-members", json.dumps(ghost).encode(), key=b"ghost:1"
            )
        finally:
            await producer.stop()
        async with aiohttp.ClientSession() as http:
            seen: list[Any] = []

            async def exact() -> bool:  # the ghost record is read within a poll
                answers = await ask_all(http, workers, expected)
                assert not answers.wrong, answers.wrong[:5]
                assert ghost_url not in answers.forwarded_to, answers.forwarded_to
                seen[:] = [answers.exact, answers.unavailable[:3]]
                return bool(answers.exact == len(workers) * N_ORDERS)

            await waits.until(  # then every answer holds
                exact,
                what="every key exact with the ghost record read",
                progress=lambda: (seen[0] if seen else None, tuple(w.log_size() for w in workers)),
                poll_s=0.2,
                detail=lambda: seen,
            )
            for _ in range(3):  # and it stays so
                again = await ask_all(http, workers, expected)
                assert again.exact == len(workers) * N_ORDERS, again.unavailable[:3]
    finally:
        for w in workers:
            if w.alive:
                w.stop()
