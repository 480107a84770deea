"""A crash at each step of the commit order (``engine/commit.py``), on real Kafka.

A worker of the orders projection with outputs (``tests/apps/crash_app.py``: a table
and a derived event per input; every agent has tables, so the offset is settled after
the store write, outside the transaction) runs under the crash-point launcher
(:mod:`tests.support.crashpoint`), which kills it with SIGKILL at one step of its fifth
commit. The test then reads what that step left durable, where the commit order says
it must be (the crashed partition's store checkpoint, the group's committed offset, the
batch's derived events as a ``read_committed`` reader sees them), restarts the worker,
and checks every event applied once (the table, a count per order, exact) and every
derived event sent once (``read_committed``, a count per id).

The events carry ``streamversion``, so both guards of exactly-once state are seen on
their own. The restart resumes from the store's checkpoint, never from the group's
offset (behind it after ``after_write``): nothing is redelivered, so the stream-version
guard skips nothing (a resume from the offset would show as skips). Then the crashed
batch's events are sent to the topic again, as a producer's retry or the forwarder's
at-least-once relay sends them: the guard alone must skip each, with no derived event
sent again.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp.codecs import kafka as codec
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import CHECKPOINT_KEY, META, spaces_for
from streamapp.tables.store import RocksStore
from tables.orders import order_status
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.crash_app:app"
BATCH = 5
"""The commit that crashes: earlier ones are durable, later ones never happened."""


async def _read(bootstrap: str, topic: str, *, committed: bool = True) -> list[Any]:
    """Every record of ``topic`` up to its end offsets as they are now (``read_committed``
    unless ``committed`` is False)."""
    return await read_topic(bootstrap, topic, committed=committed)


def _ids(records: list[Any]) -> Counter[str]:
    return Counter(codec.decode(r.key, r.value, r.headers).id for r in records)


async def _committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int:
    """The group's committed offset of ``tp`` (0: none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group, partitions=[tp])
    finally:
        await admin.close()
    meta = found.get(tp)
    return meta.offset if meta is not None and meta.offset >= 0 else 0


def _store_checkpoint(data_dir: Path, app_id: str, partition: int) -> Checkpoint:
    """The checkpoint in the (dead) worker's store of agent ``project``, ``partition``."""
    store = RocksStore(data_dir / app_id / "project" / str(partition), spaces_for([order_status]))
    try:
        return Checkpoint.decode(store.get(META, CHECKPOINT_KEY))
    finally:
        store.close()


def _skipped(status: dict[str, Any] | None) -> dict[str, int]:
    """Per partition of a worker's ``/status``: events skipped as already applied (the
    stream-version guard; the app has no filter), after checking every event was
    versioned."""
    assert status is not None
    parts = status["partitions"]
    assert all(part["unversioned"] == 0 for part in parts.values()), parts
    return {name: part["outcomes"].get("filtered", 0) for name, part in parts.items()}


@pytest.mark.parametrize("point", crashpoint.POINTS)
async def test_a_crash_at_each_step_of_the_commit_order_applies_and_sends_once(
    point: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"cp{uuid.uuid4().hex[:6]}-"
    app_id, topic, derived = f"{ns}crash", f"{ns}crash-orders", f"{ns}crash-derived"
    create_topics(kafka_bootstrap, ns, APP)
    events, expected = order_events(n_orders=200, n_events=4_000, seed=5, versioned=True)
    await produce(kafka_bootstrap, topic, events)  # all of it waits: many batches to come
    report = tmp_path / "crash.json"
    data = tmp_path / "data"
    small = {"STREAMAPP_MAX_BATCH_RECORDS": "100"}  # batches of at most 100 records
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
            crashpoint.BATCH: str(BATCH),
            crashpoint.REPORT: str(report),
        },
    ).start()
    assert crashing.proc is not None
    try:
        assert await crashing.exited() == -9, crashing.log_text()[-3000:]
    finally:
        if crashing.alive:  # it never reached the crash: not left running
            crashing.kill()
    crash = json.loads(report.read_text())
    assert crash["point"] == point
    p, end, outputs = crash["partition"], crash["live"], crash["outputs"]
    assert outputs, crash
    assert end is not None, crash

    # What the crash left durable, each where the commit order says.
    tp = TopicPartition(topic, p)
    offset = await _committed_offset(kafka_bootstrap, app_id, tp)
    stored = _store_checkpoint(data, app_id, p).live or 0
    visible = _ids(await _read(kafka_bootstrap, derived))
    seen = [o in visible for o in outputs]
    where = (
        f"{point} in {topic}[{p}]: batch of {len(outputs)} sends ending at {end}, store at "
        f"{stored}, offset {offset}, sends visible {sum(seen)}"
    )
    print(where)
    assert offset <= stored, f"settled before durable in the table; {where}"
    if point == "before_commit":  # sent, not committed: aborted on restart
        sent = _ids(await _read(kafka_bootstrap, derived, committed=False))
        assert all(o in sent for o in outputs), where
        assert not any(seen), f"a read_committed reader saw an open batch; {where}"
        assert stored < end, where
    elif point == "after_commit":  # committed; the store behind its changelog
        assert all(seen), where
        assert stored < end, where
    elif point == "after_write":  # durable in the store; the offset behind it
        assert all(seen), where
        assert stored == end, where
        assert offset < end, where
    else:  # after_settle: all three
        assert all(seen), where
        assert stored == end == offset, where

    worker = WorkerProc(
        kafka_bootstrap, ns, data, tmp_path / "w2.log", app_ref=APP, extra_env=small
    ).start()
    try:
        status = await wait_ready(worker)
        restored = status["partitions"][f"{topic}[{p}]"]["restored"]
        if point == "after_commit":  # the store got the batch from its changelog
            assert restored > 0, status
        else:
            assert restored == 0, status
        await wait_caught_up(kafka_bootstrap, app_id, topic, 180, [worker])
        assert_exact(await read_table([worker], "order_status", list(expected)), expected)
        # From the checkpoint: nothing the store holds came again. A resume from the
        # group's offset would (the guard skipping it, the table still exact).
        assert _skipped(await worker.status()) == dict.fromkeys(_skipped(status), 0), where

        # The batch sent again (a producer's retry): the stream-version guard skips it.
        batch = set(outputs)
        again = [e for e in events if f"{e.id}/projected" in batch]
        n_again = len(again)
        assert n_again == len(outputs), where
        await produce(kafka_bootstrap, topic, again)
        await wait_caught_up(kafka_bootstrap, app_id, topic, 180, [worker])
        assert_exact(await read_table([worker], "order_status", list(expected)), expected)
        ids = _ids(await _read(kafka_bootstrap, derived))
        wanted = {f"{e.id}/projected" for e in events}
        assert set(ids) == wanted, (len(set(ids) - wanted), len(wanted - set(ids)))
        twice = [i for i, n in ids.items() if n > 1]
        assert not twice, f"{len(twice)} derived events sent twice, e.g. {twice[:5]}"
        skipped = _skipped(await worker.status())
        assert skipped[f"{topic}[{p}]"] == n_again, f"{skipped}; {where}"
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
