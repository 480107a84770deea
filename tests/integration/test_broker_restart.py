"""The broker goes away mid-load and comes back: the worker rides it out, state exact."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from .harness import (
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    restart_service,
    wait_caught_up,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)  # a loaded machine may take minutes to restart the broker
async def test_worker_rides_out_a_broker_restart(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if services.how != "scripts/services":
        pytest.skip("restarts the broker of scripts/services only")
    bootstrap = services.kafka
    ns = f"brk{uuid.uuid4().hex[:6]}-"
    create_topics(bootstrap, ns)
    events, expected = order_events(n_orders=300, n_events=15_000)
    worker = WorkerProc(bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    try:
        await wait_ready(worker)
        await produce(bootstrap, f"{ns}orders", events[:7000])
        await asyncio.sleep(0.5)  # mid-batch
        try:
            restart_service("down", "kafka")
            await asyncio.sleep(5)
            assert worker.alive  # it waits for the broker, it does not die
        finally:
            restart_service("up", "kafka")
        await produce(bootstrap, f"{ns}orders", events[7000:])
        await wait_caught_up(bootstrap, f"{ns}orders", f"{ns}orders", 180, [worker])
        await wait_ready(worker)
        table = await read_table([worker], "order_status", list(expected))
        assert_exact(table, expected)
        noise = [line for line in worker.log_text().splitlines() if " aiokafka" in line]
        assert len(noise) < 100, len(noise)  # client errors are throttled, not a flood
    finally:
        if worker.alive:
            assert worker.stop() == 0
