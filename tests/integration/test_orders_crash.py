"""Crashes and restarts: kill -9 mid-load loses nothing and applies nothing twice."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from .harness import (
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    wait_caught_up,
    wait_group_ready,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_sigkill_three_times_mid_load(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns = f"kill{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=1000, n_events=100_000)
    worker = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "worker.log").start()
    try:
        await wait_ready(worker)
        # A third of the events per kill, in order, each kill 1 s into its third (about
        # 11 s at 3,000 events/s): mid-load however fast the worker or slow the machine.
        third = -(-len(events) // 3)
        for k in range(3):
            await wait_ready(worker)
            part = events[k * third : (k + 1) * third]
            producing = asyncio.create_task(
                produce(kafka_bootstrap, f"{ns}orders", part, rate=3000)
            )
            await asyncio.sleep(1.0)
            assert not producing.done()  # the kill comes mid-load
            worker.kill()  # SIGKILL: no flush, no commit, maybe mid-transaction
            worker = WorkerProc(
                kafka_bootstrap, ns, tmp_path / "data", tmp_path / "worker.log", port=worker.port
            ).start()
            await producing  # in order: the next third starts after this one
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 180, [worker])
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
    finally:
        if worker.alive:
            worker.kill()


async def test_restart_after_clean_stop_resumes_from_checkpoint(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"restart{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=200, n_events=5_000)
    first = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    await wait_ready(first)
    await produce(kafka_bootstrap, f"{ns}orders", events)
    await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 60, [first])
    assert first.stop() == 0

    ends = await _end_offsets(kafka_bootstrap, f"{ns}orders")
    second = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        status = await wait_ready(second)
        parts = status["partitions"]
        assert len(parts) == 8
        for name, part in parts.items():
            p = int(name.rsplit("[", 1)[1].rstrip("]"))
            assert part["start_position"] == ends[p] > 0, (name, part)  # not offset 0
            assert part["processed"] == 0
            assert part["restored"] == 0  # the local store was current

        more, _ = order_events(n_orders=200, n_events=200, seed=99)
        await produce(kafka_bootstrap, f"{ns}orders", more)
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 60, [second])
        status = await wait_ready(second)
        assert sum(p["processed"] for p in status["partitions"].values()) == 200
        table = await read_table([second], "order_status", list(expected))
        # The first 200 events of any seed place each order once: one more event each.
        assert_exact(table, {oid: (n + 1, "placed") for oid, (n, _) in expected.items()})
    finally:
        assert second.stop() == 0


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(8)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_sigkill_with_a_survivor_that_takes_over(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The survivor restores the killed worker's partitions from their changelogs, whose
    last transaction may have been open at the kill: it must be aborted, never applied."""
    ns = f"takeover{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=1000, n_events=60_000, seed=3)
    survivor = WorkerProc(kafka_bootstrap, ns, tmp_path / "s", tmp_path / "s.log").start()
    victim = WorkerProc(kafka_bootstrap, ns, tmp_path / "v", tmp_path / "v.log").start()
    try:
        await wait_ready(survivor)
        await wait_ready(victim)
        producing = asyncio.create_task(produce(kafka_bootstrap, f"{ns}orders", events, rate=3000))
        for _ in range(2):
            await asyncio.sleep(3)
            victim.kill()
            await asyncio.sleep(12)  # the session times out: the survivor takes everything
            victim = WorkerProc(
                kafka_bootstrap, ns, tmp_path / "v", tmp_path / "v.log", port=victim.port
            ).start()
        await producing
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 180, [survivor, victim])
        await wait_group_ready([survivor, victim], partitions=8)
        table = await read_table([survivor, victim], "order_status", list(expected))
        assert_exact(table, expected)
        assert "restoring " in survivor.log_text()  # it did take partitions over
    finally:
        for w in (survivor, victim):
            if w.alive:
                w.kill()
