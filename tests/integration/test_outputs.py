"""Outputs, several agents per topic and co-partitioned reads, on real Kafka, with worker
processes (``streamapp worker``) and ``kill -9``.

Derived events are counted by a ``read_committed`` consumer downstream: each exactly
once, whatever the kills; the tables of the agents sharing the topic are exact.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamapp import Event
from streamapp.codecs import kafka as codec
from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    create_topics,
    order_events,
    produce,
    read_table,
    read_topic,
    streamapp_cmd,
    wait_caught_up,
    wait_group_ready,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTPUTS = "tests.apps.outputs_app:app"
COPART = "tests.apps.copart_app:app"


async def read_committed(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` a ``read_committed`` consumer sees, from the beginning
    to the end offsets as they are now."""
    return await read_topic(bootstrap, topic)


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_derived_events_exactly_once_and_two_agents_exact_through_sigkill(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Three agents on one topic (``count``: table + sends, ``echo``: sends only,
    ``tally``: table only), the worker killed with SIGKILL three times mid-load: every
    input has exactly one ``/counted`` and one ``/echoed`` derived event downstream, the
    counts they carry are 1..n per order once each, and both tables are exact."""
    ns = f"outs{uuid.uuid4().hex[:6]}-"
    plan = create_topics(kafka_bootstrap, ns, OUTPUTS)
    assert f"{ns}outs-derived\t4 partitions\toutput" in plan
    events, expected = order_events(n_orders=500, n_events=30_000, seed=11)
    topic = f"{ns}outs-orders"

    def worker(port: int | None = None) -> WorkerProc:
        w = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log", app_ref=OUTPUTS)
        if port is not None:
            w.port = port
        return w.start()

    w = worker()
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
        await wait_caught_up(kafka_bootstrap, f"{ns}outs", topic, 240, [w])

        records = await read_committed(kafka_bootstrap, f"{ns}outs-derived")
        derived = [codec.decode(r.key, r.value, r.headers) for r in records]
        ids = Counter(e.id for e in derived)
        wanted = {f"{e.id}/{kind}" for e in events for kind in ("counted", "echoed")}
        assert set(ids) == wanted, (len(set(ids) - wanted), len(wanted - set(ids)))
        twice = [i for i, n in ids.items() if n > 1]
        assert not twice, f"{len(twice)} derived events seen more than once, e.g. {twice[:5]}"
        numbers: dict[str, list[int]] = {}
        for r, e in zip(records, derived, strict=True):
            assert e.stream_id is not None
            assert r.key == e.stream_id.encode()  # keyed by stream id
            if e.type == "counted":
                numbers.setdefault(e.stream_id, []).append(int(e.data["n"]))
        for oid, (n, _) in expected.items():
            assert sorted(numbers[oid]) == list(range(1, n + 1)), oid

        keys = list(expected)
        for table in ("counts", "tallies"):
            values = await read_table([w], table, keys)
            wrong = {k: (values[k], n) for k, (n, _) in expected.items() if values[k] != n}
            assert not wrong, f"{table}: {len(wrong)} wrong, e.g. {list(wrong.items())[:5]}"
        assert "UnsupportedVersion" not in w.log_text()
    finally:
        if w.alive:
            w.kill()


async def test_a_co_partitioned_read_across_two_workers(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Two workers: each owns the same partition numbers of both topics (the range
    assignor), and every look reads the exact total its key had."""
    ns = f"cp{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, COPART)
    workers = [
        WorkerProc(
            kafka_bootstrap, ns, tmp_path / name, tmp_path / f"{name}.log", app_ref=COPART
        ).start()
        for name in ("a", "b")
    ]
    try:
        await wait_group_ready(workers, partitions=8)
        for w in workers:
            status = await w.status()
            assert status is not None
            owned: dict[str, set[int]] = {}
            for part in status["partitions"].values():
                owned.setdefault(part["topic"], set()).add(part["partition"])
            assert owned[f"{ns}cp-adds"] == owned[f"{ns}cp-looks"], owned

        keys = [f"k{i:03d}" for i in range(200)]
        adds = [
            Event.create("add", stream_id=keys[i % 200], data={"n": i}, id=f"add{i}")
            for i in range(2000)
        ]
        totals = Counter[str]()
        for e in adds:
            assert e.stream_id is not None
            totals[e.stream_id] += int(e.data["n"])
        await produce(kafka_bootstrap, f"{ns}cp-adds", adds)
        await wait_caught_up(kafka_bootstrap, f"{ns}cp", f"{ns}cp-adds", 120, workers)
        looks = [Event.create("look", stream_id=k, id=f"look-{k}") for k in keys]
        await produce(kafka_bootstrap, f"{ns}cp-looks", looks)
        await wait_caught_up(kafka_bootstrap, f"{ns}cp", f"{ns}cp-looks", 120, workers)
        seen = await read_table(workers, "seen", keys)
        wrong = {k: seen[k] for k in keys if seen[k] != {"total": totals[k], "look": f"look-{k}"}}
        assert not wrong, f"{len(wrong)} wrong, e.g. {list(wrong.items())[:5]}"
    finally:
        for w in workers:
            if w.alive:
                assert w.stop() == 0


def test_a_read_that_is_not_co_partitioned_is_refused(kafka_bootstrap: str) -> None:
    """``cp-looks`` with 8 partitions against ``cp-adds`` with 4: the worker refuses the
    app at load, naming both agents and counts (nothing is created)."""
    ns = f"cpbad{uuid.uuid4().hex[:6]}-"
    out = run_watched(
        streamapp_cmd("worker", "-A", COPART),
        env=app_env(kafka_bootstrap, ns, COPART_LOOKS_PARTITIONS="8"),
        cwd=ROOT,
    )
    assert out.returncode != 0
    assert (
        f"agent 'reader' (topic '{ns}cp-looks', 8 partitions) cannot read table 'totals' of "
        f"agent 'writer' (topic '{ns}cp-adds', 4 partitions)"
    ) in out.stderr
    assert "Traceback" not in out.stderr
