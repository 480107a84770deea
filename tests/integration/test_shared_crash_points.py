"""A crash inside the worker's shared transaction (exactly-once v2), on real Kafka.

One worker owns both partitions of the crash app (``tests/apps/crash_app.py``); their
batches of a poll cycle commit in one transaction of the worker's transactional writer.
The crash-point launcher (:mod:`tests.support.crashpoint`) kills the worker with SIGKILL
in the third transaction that holds both partitions' batches: after the transaction
committed and before either partition wrote its store (``shared_after_commit``), or
after the first partition wrote its store and before the second did
(``shared_between_writes``). The test reads what is durable where (each store at the
transaction or before it, every derived event of both batches visible to a
``read_committed`` reader), restarts the worker and checks that each store behind its
changelog restored the tail, that every event applied once (the table, a count per
order, exact) and every derived event was sent once.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from streamapp.codecs import kafka as codec
from tests.support import crashpoint

from .harness import (
    WorkerProc,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    read_topic,
    wait_caught_up,
    wait_ready,
)
from .test_crash_points import _committed_offset, _store_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.crash_app:app"
SHARED = 3
"""The shared transaction that crashes: earlier ones are durable."""


def _ids(records: list[Any]) -> Counter[str]:
    return Counter(codec.decode(r.key, r.value, r.headers).id for r in records)


@pytest.mark.parametrize("point", crashpoint.SHARED_POINTS)
async def test_a_crash_inside_a_shared_transaction_applies_and_sends_once(
    point: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"scp{uuid.uuid4().hex[:6]}-"
    app_id, topic, derived = f"{ns}crash", f"{ns}crash-orders", f"{ns}crash-derived"
    create_topics(kafka_bootstrap, ns, APP)
    events, expected = order_events(n_orders=200, n_events=4_000, seed=7, versioned=True)
    await produce(kafka_bootstrap, topic, events)  # both partitions: many batches to come
    report = tmp_path / "crash.json"
    data = tmp_path / "data"
    small = {"STREAMAPP_MAX_BATCH_RECORDS": "100"}
    crashing = WorkerProc(
        kafka_bootstrap,
        ns,
        data,
        tmp_path / "w1.log",
        app_ref=APP,
        launcher="tests.support.crashpoint",
        extra_env={
            **small,
            crashpoint.AT: point,
            crashpoint.BATCH: str(SHARED),
            crashpoint.REPORT: str(report),
        },
    ).start()
    try:
        assert await crashing.exited() == -9, crashing.log_text()[-3000:]
    finally:
        if crashing.alive:  # it never reached the crash: not left running
            crashing.kill()
    crash = json.loads(report.read_text())
    assert crash["point"] == point
    parts = {int(p): part for p, part in crash["partitions"].items()}
    assert len(parts) == 2, crash

    visible = _ids(await read_topic(kafka_bootstrap, derived))
    stored: dict[int, int] = {}
    for p, part in parts.items():
        end, outputs = part["live"], part["outputs"]
        assert end is not None, crash
        assert outputs, crash
        offset = await _committed_offset(kafka_bootstrap, app_id, TopicPartition(topic, p))
        stored[p] = _store_checkpoint(data, app_id, p).live or 0
        where = f"{point}: {topic}[{p}] ends at {end}, store at {stored[p]}, offset {offset}"
        print(where)
        assert offset <= stored[p], f"settled before durable in the table; {where}"
        assert all(o in visible for o in outputs), f"the transaction committed; {where}"
        if point == "shared_between_writes" and p == crash["written"]:
            assert stored[p] == end, where
        else:
            assert stored[p] < end, where
    behind = [p for p, part in parts.items() if stored[p] < part["live"]]
    assert len(behind) == (2 if point == "shared_after_commit" else 1), (behind, crash)

    worker = WorkerProc(
        kafka_bootstrap, ns, data, tmp_path / "w2.log", app_ref=APP, extra_env=small
    ).start()
    try:
        status = await wait_ready(worker)
        for p in parts:
            restored = status["partitions"][f"{topic}[{p}]"]["restored"]
            if p in behind:  # the store got the transaction's batch from its changelog
                assert restored > 0, status
            else:
                assert restored == 0, status
        await wait_caught_up(kafka_bootstrap, app_id, topic, 180, [worker])
        assert_exact(await read_table([worker], "order_status", list(expected)), expected)
        ids = _ids(await read_topic(kafka_bootstrap, derived))
        wanted = {f"{e.id}/projected" for e in events}
        assert set(ids) == wanted, (len(set(ids) - wanted), len(wanted - set(ids)))
        twice = [i for i, n in ids.items() if n > 1]
        assert not twice, f"{len(twice)} derived events sent twice, e.g. {twice[:5]}"
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
