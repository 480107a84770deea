"""The broker goes away mid-load and comes back: the worker rides it out, state exact."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Services
from tests.support.services import KafkaToRestart, kafka_to_restart

from .harness import (
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    processed,
    produce,
    read_table,
    wait_caught_up,
    wait_ready,
    wait_statuses,
)

# serial: it takes a shared service down, freezes a process or skews a clock (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]


def behind(status: dict[str, Any]) -> int:
    """Live deliveries the worker's partitions have not committed yet (its /status)."""
    return sum(int(p["lag"] or 0) for p in status["partitions"].values())


async def test_worker_rides_out_a_broker_restart(services: Services, tmp_path: Path) -> None:
    with kafka_to_restart(services, tmp_path / "services") as broker:
        await _rides_out(broker, tmp_path)


async def _rides_out(broker: KafkaToRestart, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    ns = f"brk{uuid.uuid4().hex[:6]}-"
    create_topics(bootstrap, ns)
    chunk, rounds = 20_000, 4
    events, expected = order_events(n_orders=300, n_events=chunk * rounds + 5_000)
    worker = WorkerProc(bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        await wait_ready(worker)
        # Mid-load, observed: the worker has processed some and has more to go. It keeps
        # up with a bulk producer, so it is frozen while a backlog goes in, then woken;
        # when its first answer after waking shows the backlog drained already, again.
        assert worker.proc is not None
        sent = before = 0
        mid: dict[str, Any] | None = None
        for _ in range(rounds):
            worker.proc.send_signal(signal.SIGSTOP)
            try:
                await produce(bootstrap, f"{ns}orders", events[sent : sent + chunk])
                sent += chunk
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            (first,) = await wait_statuses(
                [worker], lambda ss, b=before: processed(ss[0]) > b, "processing the backlog", 60
            )
            before = processed(first)
            if before < sent:
                mid = first
                break
        assert mid is not None, f"the worker drained {rounds} backlogs of {chunk:,} each unseen"
        print(f"broker down after {processed(mid)} of {sent:,} processed, {behind(mid)} behind")
        try:
            broker.down()
            await asyncio.sleep(5)
            assert worker.alive  # it waits for the broker, it does not die
        finally:
            broker.up()
        await produce(bootstrap, f"{ns}orders", events[sent:])
        await wait_caught_up(bootstrap, f"{ns}orders", f"{ns}orders", 180, [worker])
        await wait_ready(worker)
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
        noise = [line for line in worker.log_text().splitlines() if " aiokafka" in line]
        assert len(noise) < 100, len(noise)  # client errors are throttled, not a flood
    finally:
        if worker.alive:
            assert worker.stop() == 0
