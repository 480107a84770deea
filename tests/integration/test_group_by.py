"""Re-keying (``group_by``) on real Kafka with worker processes and ``kill -9``.

Order events keyed by order id feed a per-customer running total through the internal
repartition topic: every customer's total is exact through three SIGKILLs mid-load,
each event is forwarded exactly once (as a ``read_committed`` consumer sees it), and
views route a customer to the owner of its repartition partition across two workers.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import Event
from streamapp.codecs import kafka as codec
from streamapp.topics import partition_for
from tests.support.waits import frozen, run_watched, until

from .harness import (
    ROOT,
    WorkerProc,
    alive,
    app_env,
    create_topics,
    partitions_of,
    produce,
    read_table,
    streamapp_cmd,
    wait_caught_up,
    wait_group_ready,
    wait_ready,
)
from .test_outputs import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGROUP = "tests.apps.regroup_app:app"


def customer_orders(
    n_orders: int, n_events: int, customers: int, seed: int = 3
) -> tuple[list[Event], Counter[str]]:
    """Events keyed by order id (no ``streamversion``: only the transactions can keep the
    totals exact), each order of one customer; the expected total per customer."""
    rng = random.Random(seed)
    owner = {f"order-{i:05d}": f"cust-{rng.randrange(customers):04d}" for i in range(n_orders)}
    totals: Counter[str] = Counter()
    events = []
    for i in range(n_events):
        order = f"order-{rng.randrange(n_orders):05d}"
        amount = rng.randrange(1, 1000)
        totals[owner[order]] += amount
        events.append(
            Event.create(
                "order.line",
                stream_id=order,
                id=f"line-{i}",
                source="tests",
                data={"customer": owner[order], "amount": amount},
            )
        )
    return events, totals


async def wait_committed(
    bootstrap: str,
    group: str,
    ends: dict[int, int],
    topic: str,
    stalled_s: float,
    workers: list[WorkerProc],
) -> None:
    """Until ``group`` committed ``topic`` up to ``ends`` (per partition: after its last
    committed record; a transactional topic ends with a marker, so its lag never reaches
    0) and no worker is in a batch; fails once neither moved for ``stalled_s``."""
    behind: dict[int, int] = {}
    statuses: list[dict[str, Any] | None] = []

    async def committed_all() -> bool:
        alive(workers)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            committed = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        done = {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}
        behind.clear()
        behind.update({p: end - done.get(p, 0) for p, end in ends.items() if done.get(p, 0) < end})
        statuses[:] = [await w.status() for w in workers]
        idle = all(s and not any(p["busy"] for p in s["partitions"].values()) for s in statuses)
        return not behind and idle

    await until(
        committed_all,
        what=f"group {group} committed {topic} to its ends",
        progress=lambda: (frozen(behind), partitions_of(statuses)),
        stalled_s=stalled_s,
        poll_s=0.5,
        detail=lambda: behind,
    )


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_per_customer_totals_exact_through_sigkill(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Orders (4 partitions, keyed by order id) re-keyed by customer into 6 repartition
    partitions; the worker is killed with SIGKILL three times mid-load. Then every
    customer's total is exact, every event was forwarded once, keyed by its customer on
    its customer's partition, and a second worker shares the partitions with views
    answering every customer from its owner."""
    ns = f"rk{uuid.uuid4().hex[:6]}-"
    plan = create_topics(kafka_bootstrap, ns, REGROUP)
    repartition = f"{ns}rk-per_customer-repartition"
    assert f"{repartition}\t6 partitions\trepartition" in plan
    events, expected = customer_orders(n_orders=2000, n_events=30_000, customers=300)
    topic, group = f"{ns}rk-orders", f"{ns}rk"

    def worker(name: str = "a", port: int | None = None) -> WorkerProc:
        w = WorkerProc(
            kafka_bootstrap, ns, tmp_path / name, tmp_path / f"{name}.log", app_ref=REGROUP
        )
        if port is not None:
            w.port = port
        return w.start()

    w = worker()
    second: WorkerProc | None = None
    try:
        await wait_ready(w)
        # A third of the events per kill, in order, each kill 1 s into its third (about
        # 4 s at 2,500 events/s): mid-load however fast the worker or slow the machine.
        third = -(-len(events) // 3)
        for k in range(3):
            await wait_ready(w)
            part = events[k * third : (k + 1) * third]
            producing = asyncio.create_task(produce(kafka_bootstrap, topic, part, rate=2500))
            await asyncio.sleep(1.0)
            assert not producing.done()  # the kill comes mid-load
            w.kill()  # no flush, no commit, maybe mid-transaction
            w = worker(port=w.port)
            await producing  # in order: the next third starts after this one
        await wait_caught_up(kafka_bootstrap, group, topic, 240, [w])

        records = await read_committed(kafka_bootstrap, repartition)
        forwarded = Counter[str]()
        for r in records:
            event = codec.decode(r.key, r.value, r.headers)
            forwarded[event.id] += 1
            assert r.key == event.data["customer"].encode()  # keyed by the new key
            assert r.partition == partition_for(r.key, 6)
            assert event.stream_id is not None
            assert event.stream_id.startswith("order-")
        assert set(forwarded) == {e.id for e in events}
        twice = [i for i, n in forwarded.items() if n > 1]
        assert not twice, f"{len(twice)} events forwarded more than once, e.g. {twice[:5]}"
        ends: dict[int, int] = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        await wait_committed(kafka_bootstrap, group, ends, repartition, 90, [w])

        customers = sorted(expected)
        totals = await read_table([w], "totals", customers)
        wrong = {c: (totals[c], n) for c, n in expected.items() if totals[c] != n}
        assert not wrong, f"{len(wrong)} customers wrong, e.g. {list(wrong.items())[:5]}"

        second = worker("b")
        await wait_group_ready([w, second], partitions=4 + 6)
        totals = await read_table([w, second], "totals", customers)  # one owner per key
        wrong = {c: (totals[c], n) for c, n in expected.items() if totals[c] != n}
        assert not wrong, f"after the rebalance {len(wrong)} wrong: {list(wrong.items())[:5]}"
        assert "UnsupportedVersion" not in w.log_text()
    finally:
        for proc in (w, second):
            if proc is not None and proc.alive:
                proc.kill()


def test_the_worker_names_a_missing_repartition_topic(kafka_bootstrap: str) -> None:
    """Without ``streamapp topics create`` the worker refuses to start, naming the
    repartition topic among the missing ones and the command that makes it."""
    ns = f"rkmiss{uuid.uuid4().hex[:6]}-"
    out = run_watched(
        streamapp_cmd("worker", "-A", REGROUP),
        env=app_env(kafka_bootstrap, ns),
        cwd=ROOT,
    )
    assert out.returncode != 0
    assert f"{ns}rk-per_customer-repartition" in out.stderr
    assert f"streamapp topics create -A {REGROUP}" in out.stderr
    assert "Traceback" not in out.stderr
