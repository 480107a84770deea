"""Coalesced offset commits on a real group: every partition's latest position lands,
positions recorded while a commit is in flight (observed) go with the next one, a
position of a partition no longer assigned is dropped without failing the others,
nothing is recorded after close; ``settled`` returns once a partition's commit landed (a
transaction's offset goes after it), and a flush past its bound drops what is left (read
back from the broker: it never lands)."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.transports.kafka.commits import OffsetCommits
from tests.support.waits import until

pytestmark = pytest.mark.integration

PARTITIONS = 4


async def _member(bootstrap: str, partitions: int) -> tuple[str, str, AIOKafkaConsumer]:
    """A fresh topic, and a started consumer that the group assigned all of it."""
    topic, group = f"commits-{uuid.uuid4().hex[:8]}", f"commits-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()

    async def assigned() -> bool:
        await consumer.getmany(timeout_ms=100)
        return len(consumer.assignment()) == partitions

    try:  # the group forms; progress: its state on the broker (joining, syncing, stable)
        await until(
            assigned,
            what=f"group {group} assigned its {partitions} partitions of {topic}",
            progress=lambda: _group_state(bootstrap, group),
            poll_s=0.2,
        )
    except BaseException:
        await consumer.stop()
        raise
    return topic, group, consumer


async def _group_state(bootstrap: str, group: str) -> tuple[str, int]:
    """The group's state on the broker and how many members it has."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
        (described,) = response.groups
        return str(described[2]), len(described[5])  # (error, group, state, ..., members)
    finally:
        await admin.close()


async def _committed(bootstrap: str, group: str) -> dict[int, tuple[int, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: (meta.offset, meta.metadata) for tp, meta in found.items()}


async def _in_flight(commits: OffsetCommits, want: set[TopicPartition]) -> None:
    """Until the commit of ``want`` is under way (observed at every turn of the loop);
    progress: what is in flight and pending."""
    await until(
        lambda: commits.in_flight == want,
        what=f"the commit of {sorted(tp.partition for tp in want)} in flight",
        progress=lambda: (frozenset(commits.in_flight), frozenset(commits.pending)),
        poll_s=0,
    )


async def _barrier(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
    """Commit ``offset`` of ``tp`` through the consumer and wait for it: aiokafka sends a
    consumer's commits one after the other, so whatever was sent before has landed."""
    other = OffsetCommits(consumer)
    other.record(tp, offset)
    await other.flush()


async def test_positions_commit_together_latest_wins_and_unassigned_ones_are_dropped(
    kafka_bootstrap: str,
) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, PARTITIONS)
    try:
        commits = OffsetCommits(consumer)
        for p in range(PARTITIONS):
            commits.record(TopicPartition(topic, p), 1)
        for p in range(PARTITIONS):  # before the first commit goes out: replaced
            commits.record(TopicPartition(topic, p), 10 + p, f"m{p}")
        commits.record(TopicPartition(f"{topic}-not-ours", 0), 5)
        await commits.flush()
        assert await _committed(kafka_bootstrap, group) == {
            p: (10 + p, f"m{p}") for p in range(PARTITIONS)
        }
    finally:
        await consumer.stop()


async def test_positions_recorded_while_a_commit_is_in_flight_go_with_the_next_one(
    kafka_bootstrap: str,
) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, PARTITIONS)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        commits = OffsetCommits(consumer)
        for tp in tps[:2]:
            commits.record(tp, 1)
        await _in_flight(commits, set(tps[:2]))
        for p, tp in enumerate(tps):  # while the first commit is under way
            commits.record(tp, 10 + p, f"m{p}")
        assert commits.in_flight == set(tps[:2])  # still the first one: these wait
        assert commits.pending == set(tps)
        await _in_flight(commits, set(tps))  # the next commit carries them all
        await commits.flush()
        assert not commits.pending
        assert not commits.in_flight
        assert await _committed(kafka_bootstrap, group) == {
            p: (10 + p, f"m{p}") for p in range(PARTITIONS)
        }
    finally:
        await consumer.stop()


async def test_nothing_is_recorded_after_close(kafka_bootstrap: str) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, 2)
    try:
        tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        commits = OffsetCommits(consumer)
        commits.record(tp0, 10)
        await commits.close()
        commits.record(tp0, 99)
        assert not commits.pending
        assert not commits.in_flight
        await _barrier(consumer, tp1, 5)  # anything the closed one sent has landed now
        assert await _committed(kafka_bootstrap, group) == {0: (10, ""), 1: (5, "")}
    finally:
        await consumer.stop()


async def test_settled_waits_for_the_partitions_commit(kafka_bootstrap: str) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, 2)
    try:
        tp = TopicPartition(topic, 0)
        commits = OffsetCommits(consumer)
        commits.record(tp, 7)
        await commits.settled(tp)  # no flush: settled alone waits for the commit
        assert not commits.pending
        assert not commits.in_flight
        assert (await _committed(kafka_bootstrap, group))[0] == (7, "")
    finally:
        await consumer.stop()


async def test_a_flush_past_its_bound_drops_the_positions_left(kafka_bootstrap: str) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, 3)
    try:
        tp0, tp1, tp2 = (TopicPartition(topic, p) for p in range(3))
        commits = OffsetCommits(consumer)
        commits.record(tp0, 7)
        await _in_flight(commits, {tp0})
        commits.record(tp1, 8)  # waits for the next commit
        assert commits.pending == {tp1}
        commits.timeout_s = 1e-6  # no commit fits in that bound
        await commits.flush()  # timed out: tp1 dropped, the commit under way abandoned
        assert not commits.pending
        assert not commits.in_flight
        await commits.settled(tp1)  # nothing of tp1 left to wait for
        await _barrier(consumer, tp2, 3)  # anything sent before has landed now
        landed = await _committed(kafka_bootstrap, group)
        assert 1 not in landed, landed  # the dropped position never went out
        assert landed[2] == (3, "")
        commits.timeout_s = 10.0
        commits.record(tp1, 9)  # and it goes on committing
        await commits.flush()
        assert (await _committed(kafka_bootstrap, group))[1] == (9, "")
    finally:
        await consumer.stop()
