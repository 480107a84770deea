"""The broker goes away mid-load and comes back: the worker rides it out, state exact."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Services
from tests.support.services import restart

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
    bootstrap = services.kafka
    ns = f"brk{uuid.uuid4().hex[:6]}-"
    create_topics(bootstrap, ns)
    events, expected = order_events(n_orders=300, n_events=25_000)
    backlog = 20_000
    worker = WorkerProc(bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        await wait_ready(worker)
        # A backlog the worker cannot have drained by the first look: it is frozen while
        # the events go in (a worker keeps up with a bulk producer), then woken.
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGSTOP)
        try:
            await produce(bootstrap, f"{ns}orders", events[:backlog])
        finally:
            worker.proc.send_signal(signal.SIGCONT)
        # mid-load, observed: the worker has processed some and has more to go
        (mid,) = await wait_statuses(
            [worker],
            lambda ss: 0 < processed(ss[0]) < backlog,
            "processing, with a backlog",
            60,
        )
        print(f"broker down after {processed(mid)} of {backlog:,} processed, {behind(mid)} behind")
        try:
            restart(services, "down", "kafka")
            await asyncio.sleep(5)
            assert worker.alive  # it waits for the broker, it does not die
        finally:
            restart(services, "up", "kafka")
        await produce(bootstrap, f"{ns}orders", events[backlog:])
        await wait_caught_up(bootstrap, f"{ns}orders", f"{ns}orders", 180, [worker])
        await wait_ready(worker)
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
        noise = [line for line in worker.log_text().splitlines() if " aiokafka" in line]
        assert len(noise) < 100, len(noise)  # client errors are throttled, not a flood
    finally:
        if worker.alive:
            assert worker.stop() == 0
