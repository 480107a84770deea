"""``streamapp parked replay`` and ``streamapp dlq replay`` on real Kafka: records parked
(``Park``) or dead-lettered (``Retry``) while the handler failed go back to their origin
topic once it is fixed, each once per run, without the chain's and park headers, the
CloudEvent and business headers intact; ``--dry-run`` sends nothing; ``--from`` and
``--until`` bound a run; the replay mark makes a next run send only what came since.

The app is ``tests/apps/replay_app.py``: its tables list, per stream, the ids of the
events applied, and its events carry no ``streamversion``, so a record sent twice would
be listed twice.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streamapp import Event
from streamapp.codecs import kafka as codec
from streamapp.failures.republish import REPLAYED
from streamapp.topics import partition_for
from tests.support.waits import run_watched, until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    create_topics,
    read_table,
    read_topic,
    streamapp_cmd,
    wait_caught_up,
    wait_ready,
    worker_progress,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.replay_app:app"
BUSINESS = ("tenant", b"acme")
OWN = ("x-reconsume", "x-retry-hop", "x-origin-topic", "x-retry-agent", "x-dlq-reason", "x-origin")


def streams_on(partition: int, n: int, prefix: str) -> list[str]:
    """``n`` stream ids whose key is on ``partition`` of a 2-partition topic."""
    out = [
        f"{prefix}{i}" for i in range(200) if partition_for(f"{prefix}{i}".encode(), 2) == partition
    ]
    return out[:n]


def cli(bootstrap: str, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(
        streamapp_cmd(*args, "-A", APP),
        env=app_env(bootstrap, ns),
        cwd=ROOT,
    )


async def produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await producer.send_and_wait(topic, value, key=key, headers=[*headers, BUSINESS])
    finally:
        await producer.stop()


async def wait_records(bootstrap: str, topic: str, n: int, worker: WorkerProc) -> list[Any]:
    """Until ``topic`` holds ``n`` committed records (never more); fails once neither
    their count nor the worker moved for a minute."""
    got: list[Any] = []

    async def enough() -> bool:
        got[:] = await read_topic(bootstrap, topic)
        assert len(got) <= n, [r.offset for r in got]
        return len(got) == n

    async def progress() -> tuple[object, ...]:
        return len(got), await worker_progress([worker])

    await until(
        enough,
        what=f"{n} records in {topic}",
        progress=progress,
        poll_s=0.5,
        detail=lambda: worker.log_text()[-3000:],
    )
    return got


def gated_worker(bootstrap: str, tmp_path: Path, prefix: str) -> tuple[str, Path, WorkerProc]:
    """A namespace with the app's topics, the gate file (made: the handler fails the
    ``gated`` events while it exists) and the app's worker over them, not started yet."""
    ns = f"{prefix}{uuid.uuid4().hex[:6]}-"
    create_topics(bootstrap, ns, APP)
    gate = tmp_path / "gate"
    gate.touch()
    worker = WorkerProc(
        bootstrap,
        ns,
        tmp_path / "data",
        tmp_path / "w.log",
        app_ref=APP,
        extra_env={"STREAMAPP_TEST_REPLAY_GATE": str(gate)},
    )
    return ns, gate, worker


def ids_of(records: list[Any]) -> list[str]:
    return [dict(r.headers)["ce_id"].decode() for r in records]


def assert_back_as_sent(original: Any, replayed: Any, held: Any) -> None:
    """The replayed record is the one first sent: key, value, every header, and one more
    naming where it was held (``held``, the parked or dead-letter copy)."""
    assert replayed.key == original.key
    assert replayed.value == original.value
    where = f"{held.topic}/{held.partition}/{held.offset}".encode()
    assert list(replayed.headers) == [*original.headers, (REPLAYED, where)]
    names = [n for n, _ in replayed.headers[:-1]]
    assert BUSINESS in list(replayed.headers)
    assert not [n for n in names if n in OWN or n.startswith("streamapp-")], names


async def test_parked_records_go_back_once_per_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns, gate, worker = gated_worker(kafka_bootstrap, tmp_path, "rpk")
    source, parking = f"{ns}rp-park", f"{ns}rp-park.parked"
    gated = streams_on(0, 2, "g") + streams_on(1, 2, "g")  # two parked per partition
    good = streams_on(0, 2, "ok") + streams_on(1, 2, "ok")
    events = [Event.create("gated", stream_id=s, data={}) for s in gated]
    events += [Event.create("fine", stream_id=s, data={}) for s in good]
    await produce(kafka_bootstrap, source, events)
    worker.start()
    try:
        await wait_ready(worker)
        parked = await wait_records(kafka_bootstrap, parking, 4, worker)
        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        table = await read_table([worker], "applied", gated + good)
        assert all(table[s] is None for s in gated)  # parked, not applied
        assert all(len(table[s]) == 1 for s in good)
        originals = {ids_of([r])[0]: r for r in await read_topic(kafka_bootstrap, source)}
        gate.unlink()  # the handler is fixed

        dry = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", parking, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: would send 4 records back" in dry.stdout, dry.stdout
        assert dry.stdout.count("would send ") == 5  # one line per record and the count
        assert len(await read_topic(kafka_bootstrap, source)) == 8  # nothing sent

        bad = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", source)
        assert bad.returncode == 2
        assert "--topic" in bad.stderr
        assert f"the app's parking destinations: {parking}" in bad.stderr

        first = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", parking, "--until", "1")
        assert first.returncode == 0, first.stderr
        assert f"sent 2 records back to their origin topic ({source}: 2)" in first.stdout
        firsts = [
            r
            for r in parked
            if r.offset == min(x.offset for x in parked if x.partition == r.partition)
        ]
        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        table = await read_table([worker], "applied", gated)
        applied = {s for s in gated if table[s] is not None}
        assert applied == {r.key.decode() for r in firsts}  # --until 1: offset 0 of each

        rest = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", parking)
        assert rest.returncode == 0, rest.stderr
        assert f"sent 2 records back to their origin topic ({source}: 2)" in rest.stdout
        again = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", parking)
        assert again.returncode == 0, again.stderr
        assert "sent 0 records back" in again.stdout  # the mark: nothing parked since

        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        table = await read_table([worker], "applied", gated + good)
        by_stream = {r.key.decode(): ids_of([r])[0] for r in parked}
        assert {s: table[s] for s in gated} == {s: [by_stream[s]] for s in gated}
        assert all(len(table[s]) == 1 for s in good)
        replayed = await read_topic(kafka_bootstrap, source)
        assert len(replayed) == 12
        held = {ids_of([r])[0]: r for r in parked}
        for record in replayed:
            first = originals[ids_of([record])[0]]
            if (record.partition, record.offset) != (first.partition, first.offset):
                assert_back_as_sent(first, record, held[ids_of([record])[0]])
        assert sorted(ids_of(replayed)) == sorted([*originals, *by_stream.values()])
        assert "sent back by a replay" not in worker.log_text()  # no versions, no guard
    finally:
        assert worker.stop() == 0


async def test_dead_letters_go_back_bounded(kafka_bootstrap: str, tmp_path: Path) -> None:
    ns, gate, worker = gated_worker(kafka_bootstrap, tmp_path, "rpd")
    source, dlq, parking = f"{ns}rp-chain", f"{ns}rp-chain-dlq", f"{ns}rp-park.parked"
    gated = streams_on(0, 2, "d") + streams_on(1, 1, "d")
    await produce(
        kafka_bootstrap, source, [Event.create("gated", stream_id=s, data={}) for s in gated]
    )
    worker.start()
    try:
        await wait_ready(worker)
        dead = await wait_records(kafka_bootstrap, dlq, 3, worker)
        assert all(dict(r.headers)["x-reconsume"] == b"1" for r in dead)
        originals = {ids_of([r])[0]: r for r in await read_topic(kafka_bootstrap, source)}
        gate.unlink()

        wrong = cli(kafka_bootstrap, ns, "dlq", "replay", "--topic", parking)
        assert wrong.returncode == 2
        assert "it is a parking destination: use `streamapp parked replay`" in wrong.stderr
        beyond = cli(kafka_bootstrap, ns, "dlq", "replay", "--topic", dlq, "--from", "99")
        assert beyond.returncode == 1
        assert "--from 99 is beyond the end of every partition" in beyond.stderr
        assert len(await read_topic(kafka_bootstrap, source)) == 3

        pair = sorted((r for r in dead if r.partition == 0), key=lambda r: r.offset)
        assert len(pair) == 2
        skipped, kept = pair
        run = cli(
            kafka_bootstrap, ns, "dlq", "replay", "--topic", dlq, "--from", f"0:{kept.offset}"
        )
        assert run.returncode == 0, run.stderr
        assert f"sent 2 records back to their origin topic ({source}: 2)" in run.stdout
        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        table = await read_table([worker], "chained", gated)
        assert table[skipped.key.decode()] is None  # before --from
        one = cli(
            kafka_bootstrap,
            ns,
            "dlq",
            "replay",
            "--topic",
            dlq,
            "--from",
            f"0:{skipped.offset}",
            "--until",
            f"0:{skipped.offset + 1}",
            "--until",
            "1:0",
        )
        assert one.returncode == 0, one.stderr
        assert f"sent 1 records back to their origin topic ({source}: 1)" in one.stdout

        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        table = await read_table([worker], "chained", gated)
        assert {s: table[s] for s in gated} == {r.key.decode(): ids_of([r]) for r in dead}
        records = await read_topic(kafka_bootstrap, source)
        assert len(records) == 6
        held = {ids_of([r])[0]: r for r in dead}
        for record in records:
            first = originals[ids_of([record])[0]]
            if (record.partition, record.offset) != (first.partition, first.offset):
                assert_back_as_sent(first, record, held[ids_of([record])[0]])
    finally:
        assert worker.stop() == 0


async def test_a_record_whose_stream_moved_on_is_skipped_with_a_warning(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A parked event (stream version 1) whose stream applied version 2 meanwhile is
    skipped by stream version when sent back: the worker logs a WARNING naming the
    parked record, the stream and both versions; a stream that did not move on applies
    its event without one."""
    ns, gate, worker = gated_worker(kafka_bootstrap, tmp_path, "rpm")
    source, parking = f"{ns}rp-park", f"{ns}rp-park.parked"
    moved, kept = streams_on(0, 2, "mv")
    failed = Event.create("gated", stream_id=moved, data={}, version=1)
    alone = Event.create("gated", stream_id=kept, data={}, version=1)
    later = Event.create("fine", stream_id=moved, data={}, version=2)
    await produce(kafka_bootstrap, source, [failed, alone, later])
    worker.start()
    try:
        await wait_ready(worker)
        parked = await wait_records(kafka_bootstrap, parking, 2, worker)
        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        assert await read_table([worker], "applied", [moved, kept]) == {
            moved: [later.id],
            kept: None,
        }
        gate.unlink()
        sent = cli(kafka_bootstrap, ns, "parked", "replay", "--topic", parking)
        assert sent.returncode == 0, sent.stderr
        await wait_caught_up(kafka_bootstrap, f"{ns}rp", source, 60, [worker])
        assert await read_table([worker], "applied", [moved, kept]) == {
            moved: [later.id],  # the table misses the parked event: the warning says so
            kept: [alone.id],
        }
        (held,) = [r for r in parked if r.key == moved.encode()]
        warnings = [line for line in worker.log_text().splitlines() if "by a replay" in line]
        assert len(warnings) == 1, warnings
        (line,) = warnings
        for part in (
            "WARNING",
            f"agent park_ids skipped {parking}/{held.partition}/{held.offset}",
            f"its stream {moved!r} moved on",
            "the event is stream version 1",
            "table applied has applied the stream through version 2",
            "streamapp reset -A MODULE:app --agent park_ids --yes",
        ):
            assert part in line, (part, line)
    finally:
        assert worker.stop() == 0
