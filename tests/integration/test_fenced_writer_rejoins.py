"""A worker whose transactional writer is fenced while the group still assigns it its
partitions recovers by itself (Kafka).

Another producer starts with the worker's transactional id (an operator running a copy
of the worker on a copy of its data directory, or a start of the worker's own writer
left running beside the one it kept): its InitProducerId fences the worker's producer,
and the worker's next transaction fails as fenced. The partitions of that transaction
are marked lost, but the group never moved them: the worker asks the group to
rebalance, gets them back, opens them again from their changelogs and goes on. Before,
they stayed paused for good, their lag growing (a CI run met it: a damaged store's
re-opening left a writer start running that fenced the one kept). The table ends exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from .harness import (
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    wait_caught_up,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_a_worker_fenced_by_a_producer_of_its_own_id_asks_the_group_and_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    import uuid

    ns = f"fwr{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=400, n_events=3_000, seed=5)
    await produce(kafka_bootstrap, topic, events[:1_500])
    data = tmp_path / "data"
    worker = WorkerProc(kafka_bootstrap, ns, data, tmp_path / "worker.log").start()
    try:
        await wait_ready(worker)
        await wait_caught_up(kafka_bootstrap, topic, topic, 60, [worker])
        transactional_id = (data / topic / "transactional-id").read_text().strip()
        assert transactional_id

        # another producer of the worker's id: its start bumps the id's epoch
        other = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            transactional_id=f"{topic}-{transactional_id}",
            enable_idempotence=True,
        )
        await other.start()
        await other.stop()

        await produce(kafka_bootstrap, topic, events[1_500:])
        await wait_caught_up(kafka_bootstrap, topic, topic, 60, [worker])
        log = worker.log_text()
        assert "fenced by a newer producer of its transactional id" in log, log[-3000:]
        assert "marked lost but still assigned here: asking the group to rebalance" in log
        assert_exact(await read_table([worker], "order_status", sorted(expected)), expected)
        assert worker.stop() == 0
        assert "Traceback" not in worker.log_text(), worker.log_text()[-3000:]
    finally:
        if worker.alive:
            worker.kill()
