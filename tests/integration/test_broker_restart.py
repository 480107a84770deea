"""The broker goes away mid-load and comes back: the worker rides it out, state exact."""

from __future__ import annotations

import asyncio
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
    events, expected = order_events(n_orders=300, n_events=15_000)
    worker = WorkerProc(bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        await wait_ready(worker)
        await produce(bootstrap, f"{ns}orders", events[:10_000])
        # mid-load, observed: the worker has processed some and has more to go
        (mid,) = await wait_statuses(
            [worker],
            lambda ss: processed(ss[0]) > 0 and behind(ss[0]) > 0,
            "processing, with a lag",
            60,
        )
        print(f"broker down after {processed(mid)} of 10,000 processed, {behind(mid)} behind")
        try:
            restart(services, "down", "kafka")
            await asyncio.sleep(5)
            assert worker.alive  # it waits for the broker, it does not die
        finally:
            restart(services, "up", "kafka")
        await produce(bootstrap, f"{ns}orders", events[10_000:])
        await wait_caught_up(bootstrap, f"{ns}orders", f"{ns}orders", 180, [worker])
        await wait_ready(worker)
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
        noise = [line for line in worker.log_text().splitlines() if " aiokafka" in line]
        assert len(noise) < 100, len(noise)  # client errors are throttled, not a flood
    finally:
        if worker.alive:
            assert worker.stop() == 0
