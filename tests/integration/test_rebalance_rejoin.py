"""A worker joins under load: the first worker's partitions that stay with it rejoin at
once (the next generation gave them back: no one else can have held them), the moved
ones open on the second; every key exact after."""

from __future__ import annotations

import asyncio
import re
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
    wait_statuses,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONTINUOUS = re.compile(r"live (\S+) again at position \S+ \(kept open; held by no one else")
FENCED = re.compile(r"live (\S+) again at position \S+ \(kept open; fenced, the tail restored")


async def test_kept_partitions_rejoin_at_once_when_no_one_else_held_them(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"rj{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=400, n_events=12_000, seed=5)

    def worker(name: str) -> WorkerProc:
        return WorkerProc(
            kafka_bootstrap, ns, tmp_path / name, tmp_path / f"{name}.log", loglevel="debug"
        )

    w1, w2 = worker("w1").start(), worker("w2")
    producing: asyncio.Task[None] | None = None
    try:
        await wait_statuses(
            [w1], lambda ss: ss[0]["ready"] and len(ss[0]["partitions"]) == 8, "w1 owns all 8"
        )
        producing = asyncio.create_task(produce(kafka_bootstrap, f"{ns}orders", events, rate=2_000))
        await wait_statuses([w1], lambda ss: processed(ss[0]) >= 1_000, "w1 under load")
        w2.start()
        both = await wait_statuses(
            [w1, w2],
            lambda ss: (
                all(s["ready"] and s["partitions"] for s in ss)
                and sum(len(s["partitions"]) for s in ss) == 8
            ),
            "w1 and w2 own the 8 partitions together",
        )
        kept = set(both[0]["partitions"])
        await producing
        producing = None
        await wait_caught_up(kafka_bootstrap, f"{ns}orders", f"{ns}orders", 120, [w1, w2])
        assert_exact(await read_table([w1, w2], "order_status", list(expected)), expected)
        rejoined = set(CONTINUOUS.findall(w1.log_text()))
        # what w1 kept rejoined without a fence or a restore, and nothing was fenced
        assert rejoined & kept, (rejoined, kept)
        assert not FENCED.findall(w1.log_text())
        for w in (w1, w2):
            assert w.stop() == 0
            assert "Traceback" not in w.log_text()
    finally:
        if producing is not None:
            producing.cancel()
        for w in (w1, w2):
            if w.alive:
                w.kill()
