"""A local store whose changelog was deleted and made again is never served (Kafka).

A worker builds its tables, stops; the changelog topics are deleted and made again
(``streamapp reset`` run for another host's data directory, as an operator would for a
host whose stores are gone), the worker's own data directory is kept. (a) the worker
starts again on the empty changelog: its checkpoint's offset is past the changelog's
end; (b) another worker (empty data directory) first writes the new changelog past that
offset. Either way the kept store is not of the new changelog: it is wiped and
restored in full, with a warning, and every key answers the new incarnation's value
(never a value of the old state, never a mix). An ordinary restart afterwards restores
nothing: the check costs no restore when the store is of its changelog.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streamapp import Event
from tests.conftest import Services
from tests.support.waits import run_watched, until

from .harness import ROOT, WorkerProc, app_env, produce, streamapp_cmd, wait_ready
from .test_reset import APP, STREAMS, wait_tally, workload

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
CHANGED = 20
"""Streams the second incarnation's later events touch (the others keep their values)."""


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(streamapp_cmd(*args), env=env, cwd=ROOT)


async def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """End offset of each partition of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def restored(worker: WorkerProc) -> int:
    status = await worker.status()
    assert status is not None
    return sum(int(p["restored"]) for p in status["partitions"].values())


def remake_changelogs(env: dict[str, str], elsewhere: Path) -> None:
    """Delete and make again the app's changelog topics, keeping this host's stores."""
    done = run(env, "reset", "-A", APP, "--data-dir", str(elsewhere), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "and made it again empty" in done.stdout


def more_events(first: int, expected: dict[str, dict[str, int]], n: int) -> list[Event]:
    """``n`` events more (``data.n`` from ``first`` on) on the first CHANGED streams, each
    stream's versions going on from ``expected`` (which is updated)."""
    out = []
    for i in range(n):
        sid, value = f"s-{i % CHANGED:04d}", first + i
        expected[sid]["n"] += 1
        expected[sid]["sum"] += value
        version = expected[sid]["n"]
        out.append(Event.create("rs.added", stream_id=sid, data={"n": value}, version=version))
    return out


def lineage_warnings(log: str, changelog: str) -> dict[int, str]:
    """Partition -> what did not match, from the worker's lineage warnings on ``changelog``."""
    pattern = (
        rf"the local store (\S+) is not of changelog {re.escape(changelog)}\[(\d)\]: (.*?)\. It"
    )
    return {int(m[2]): f"{m[1]}: {m[3]}" for m in re.finditer(pattern, log)}


@pytest.mark.parametrize("rewritten", [False, True], ids=["empty", "rewritten_past_it"])
async def test_a_store_of_a_deleted_changelog_is_wiped_and_restored(
    services: Services, tmp_path: Path, rewritten: bool
) -> None:
    ns = f"ln{uuid.uuid4().hex[:6]}-"
    bootstrap, group = services.kafka, f"{ns}rs"
    changelog, source = f"{ns}rs-tally-changelog", f"{ns}rs-events"
    env = app_env(bootstrap, ns)
    made = run(env, "topics", "create", "-A", APP)
    assert made.returncode == 0, made.stderr
    events, expected = workload()
    await produce(bootstrap, source, events)
    data = tmp_path / "data"
    runs = iter(range(100))

    def worker(mode: str, directory: Path = data) -> WorkerProc:
        log = tmp_path / f"worker-{next(runs)}-{mode}.log"
        extra = {"RESET_TALLY_MODE": mode}
        return WorkerProc(bootstrap, ns, directory, log, app_ref=APP, extra_env=extra)

    first = worker("v1").start()
    try:
        await wait_ready(first)
        await wait_tally(first, expected, "v1")
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]
    # The store was at the changelog's end: its checkpoint says offset end - 1 (the last
    # transaction's commit marker), its last checkpoint record is at end - 2.
    old = await ends(bootstrap, changelog)
    assert all(old.values()), old

    remake_changelogs(env, tmp_path / "elsewhere")
    assert set((await ends(bootstrap, changelog)).values()) == {0}
    if rewritten:
        # Another host builds the new incarnation (v2) from the topic, then takes more
        # events, until every partition of the new changelog is past the old offsets.
        other = worker("v2", tmp_path / "other-data").start()
        try:
            await wait_ready(other)
            await wait_tally(other, expected, "v2")
            sent = len(events)
            while True:
                await produce(bootstrap, source, more_events(sent, expected, 200))
                sent += 200
                await wait_tally(other, expected, "v2")
                new = await ends(bootstrap, changelog)
                if all(new[p] > old[p] for p in old):
                    break
                assert sent < 20_000, (old, new)
        finally:
            assert other.stop() == 0, other.log_text()[-3000:]
        print(f"changelog ends: old incarnation {old}, new {new}")

    again = worker("v2").start()
    try:
        started = time.monotonic()
        await wait_ready(again)
        took = await wait_tally(again, expected, "v2", stalled_s=60)
        print(
            f"kept store -> exact v2 tally of {STREAMS} keys in {time.monotonic() - started:.1f}s"
        )
        warned = lineage_warnings(again.log_text(), changelog)
        assert sorted(warned) == list(range(PARTITIONS)), again.log_text()[-3000:]
        for p, why in warned.items():
            assert why.startswith(f"{data / group / 'tally'}/"), why
            if rewritten:  # the record it applied last is another one now
                assert f"offset {old[p] - 2})" in why or f"offset {old[p] - 2} " in why, why
                assert "carries mark" in why or "data record" in why, why
            else:
                assert f"up to offset {old[p] - 1}, but it ends at 0" in why, why
        print(f"took {took:.1f}s after ready; warnings: {warned}")
        if rewritten:
            assert await restored(again) > 0  # restored in full from the new changelog
    finally:
        assert again.stop() == 0, again.log_text()[-3000:]

    ordinary = worker("v2").start()
    try:
        await wait_ready(ordinary)
        await wait_tally(ordinary, expected, "v2", stalled_s=30)
        assert await restored(ordinary) == 0
        assert not lineage_warnings(ordinary.log_text(), changelog)
    finally:
        assert ordinary.stop() == 0, ordinary.log_text()[-3000:]


async def first_record_from(bootstrap: str, topic: str, offsets: dict[int, int]) -> dict[int, int]:
    """Per partition, the offset of the first committed record at or after ``offsets``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        out = {}
        for p, offset in offsets.items():
            tp = TopicPartition(topic, p)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            batch = await consumer.getmany(tp, timeout_ms=2000, max_records=1)
            (rec,) = batch[tp]
            out[p] = int(rec.offset)
        return out
    finally:
        await consumer.stop()


async def test_a_store_whose_record_was_compacted_away_is_restored_in_full(
    services: Services, tmp_path: Path
) -> None:
    """Compaction keeps only the newest checkpoint record: a store behind its changelog
    whose last record was compacted away cannot prove its lineage and is restored in
    full (the safe answer; the old code read the tail, right here but unproven). The
    state is exact either way, and the next ordinary restart restores nothing."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    ns = f"lc{uuid.uuid4().hex[:6]}-"
    bootstrap = services.kafka
    changelog, source = f"{ns}rs-tally-changelog", f"{ns}rs-events"
    env = app_env(bootstrap, ns)
    made = run(env, "topics", "create", "-A", APP)
    assert made.returncode == 0, made.stderr
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:  # segments roll at once and the cleaner takes any dirty closed segment (an
        # AlterConfigs replaces every config of the topic: compact is said again)
        fast = {
            "cleanup.policy": "compact",
            "segment.ms": "200",
            "min.cleanable.dirty.ratio": "0.01",
        }
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, changelog, fast)])
    finally:
        await admin.close()
    events, expected = workload()
    await produce(bootstrap, source, events)
    data = tmp_path / "data"
    runs = iter(range(100))

    def worker(directory: Path = data) -> WorkerProc:
        log = tmp_path / f"worker-{next(runs)}.log"
        return WorkerProc(bootstrap, ns, directory, log, app_ref=APP)

    first = worker().start()
    try:
        await wait_ready(first)
        await wait_tally(first, expected, "v1")
    finally:
        assert first.stop() == 0, first.log_text()[-3000:]
    marked = {p: end - 2 for p, end in (await ends(bootstrap, changelog)).items()}

    other = worker(tmp_path / "other-data").start()  # takes the partitions over, goes on
    try:
        await wait_ready(other)
        sent, started = [len(events)], time.monotonic()
        found = dict(marked)

        async def compacted() -> bool:  # a round of records rolls segments for the cleaner
            await produce(bootstrap, source, more_events(sent[0], expected, 100))
            sent[0] += 100
            await wait_tally(other, expected, "v1")
            found.update(await first_record_from(bootstrap, changelog, marked))
            return all(found[p] > marked[p] for p in marked)

        await until(  # progress: a partition's record compacted away (the cleaner's passes)
            compacted,
            what=f"checkpoint records {marked} compacted away",
            progress=lambda: tuple(sorted(found.items())),
            stalled_s=120,
            poll_s=0,
            detail=lambda: f"first records now {found}",
        )
        print(f"checkpoint records {marked} compacted away after {time.monotonic() - started:.0f}s")
    finally:
        assert other.stop() == 0, other.log_text()[-3000:]

    again = worker().start()
    try:
        await wait_ready(again)
        await wait_tally(again, expected, "v1", stalled_s=30)
        warned = lineage_warnings(again.log_text(), changelog)
        assert sorted(warned) == list(range(PARTITIONS)), again.log_text()[-3000:]
        assert all("compacted away" in why for why in warned.values()), warned
        full = await restored(again)
        now = await ends(bootstrap, changelog)
        tail = sum(now[p] - marked[p] - 2 for p in now)
        print(f"restored in full: {full} changelog records (the tail since the store: {tail})")
        assert full >= STREAMS  # every key at least once: from the start, not the tail
    finally:
        assert again.stop() == 0, again.log_text()[-3000:]

    ordinary = worker().start()
    try:
        await wait_ready(ordinary)
        await wait_tally(ordinary, expected, "v1", stalled_s=30)
        assert await restored(ordinary) == 0
        assert not lineage_warnings(ordinary.log_text(), changelog)
    finally:
        assert ordinary.stop() == 0, ordinary.log_text()[-3000:]
