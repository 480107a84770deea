"""The reference app under load while workers join and leave: state stays exact."""

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
    processed,
    produce,
    read_table,
    wait_caught_up,
    wait_ready,
    wait_statuses,
)

# make acceptance runs it (scripts/acceptance): too heavy for make test on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]


async def test_100k_events_while_workers_go_2_3_1(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns = f"scale{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=1000, n_events=100_000)

    def worker(name: str) -> WorkerProc:
        return WorkerProc(kafka_bootstrap, ns, tmp_path / name, tmp_path / f"{name}.log")

    w1, w2, w3 = worker("w1").start(), worker("w2").start(), worker("w3")
    try:
        await wait_ready(w1)
        await wait_ready(w2)
        producing = asyncio.create_task(produce(kafka_bootstrap, f"{ns}orders", events, rate=8000))
        # under load, observed: the two workers have processed some of it
        before = await wait_statuses(
            [w1, w2], lambda ss: sum(map(processed, ss)) >= 5000, "w1 and w2 under load", 120
        )
        w3.start()  # 2 -> 3
        # the third one owns some partitions, ready, beside the other two, before they leave
        three = await wait_statuses(
            [w1, w2, w3],
            lambda ss: (
                all(s["ready"] and s["partitions"] for s in ss)
                and sum(len(s["partitions"]) for s in ss) == 8
            ),
            "the three own the 8 partitions together, each some, all ready",
            120,
        )
        owned = [len(s["partitions"]) for s in three]
        assert min(owned) >= 1, owned  # each of the three owned partitions at once
        still_producing = not producing.done()
        assert w1.stop() == 0  # 3 -> 1, each a clean leave
        assert w2.stop() == 0
        await producing
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 180, [w3])
        status = await wait_ready(w3)
        assert len(status["partitions"]) == 8  # the last worker owns every partition
        assert sum(p["restored"] for p in status["partitions"].values()) > 0  # state moved
        table = await read_table([w3], "order_status", list(expected))
        assert_exact(table, expected)
        print(
            f"2 -> 3 -> 1: {sum(map(processed, before))} events processed by two before the "
            f"third joined; partitions owned by the three {owned}; load still running at the "
            f"leaves: {still_producing}"
        )
    finally:
        for w in (w1, w2, w3):
            if w.alive:
                w.kill()
