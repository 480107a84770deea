"""A parking or dead-letter topic read back for ``streamapp parked replay`` and ``dlq
replay`` (:mod:`streamapp.failures.republish`).

A run reads each partition from ``--from`` (default: the replay mark, else the start)
up to ``--until`` (default: the end as of the run's start, so records parked while it
runs wait for the next run), ``read_committed`` (a dead-letter copy of an aborted batch
was never settled: its original comes again), each offset once. The replay mark is the
committed offset of consumer group ``{group}-replay`` on that topic: after a run it
stands past the last record confirmed at its origin (committed every
:data:`MARK_EVERY` records and when the run ends or stops), so the next run without
``--from`` sends only what was parked since; a crash between a confirm and its mark
sends that record again (at least once across runs). A dry run leaves it alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ...errors import ReplayError, SourceError
from ...failures.republish import Held, Offsets
from ...settings.settings import Settings
from .connection import with_startup_retry
from .topology import partition_counts

MARK_EVERY = 500
"""Records sent between two commits of the replay mark."""
STALL_S = 30.0
"""How long a partition may hand out nothing while records are left in its range."""


def replay_group(group_id: str) -> str:
    """The consumer group whose committed offsets are the replay marks."""
    return f"{group_id}-replay"


class KafkaHeldReader:
    """One parking or dead-letter topic, read once between fixed bounds
    (:class:`~streamapp.failures.republish.HeldReader`). ``mark``: keep the replay mark (False for
    a dry run)."""

    def __init__(
        self, settings: Settings, topic: str, start: Offsets, until: Offsets, *, mark: bool
    ) -> None:
        self.settings, self.topic, self.start_at, self.until = settings, topic, start, until
        self.mark = mark
        self.group = replay_group(settings.group_id)
        self.ranges: dict[TopicPartition, tuple[int, int]] = {}
        """Per partition: the first offset and the end (exclusive) this run reads."""
        self._marks: dict[TopicPartition, int] = {}
        self._done: dict[TopicPartition, int] = {}
        self._unmarked = 0
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=self.group,
            client_id=f"{settings.app_id}-replay",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )

    async def start(self) -> None:
        count = (await partition_counts(self.settings, [self.topic])).get(self.topic)
        if not count:
            raise ReplayError(
                f"--topic {self.topic!r}: no such topic on Kafka at "
                f"{self.settings.kafka_bootstrap} (setting kafka_bootstrap); make the "
                "app's topics with `streamapp topics create`"
            )
        consumer = self._consumer
        await with_startup_retry(self.settings, "Kafka replay reader", consumer.start)
        try:
            tps = [TopicPartition(self.topic, p) for p in range(count)]
            consumer.assign(tps)
            begin = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)  # read_committed: the last stable offset
            for tp in tps:
                committed = await consumer.committed(tp)
                if committed is not None:
                    self._marks[tp] = committed
        except KafkaError as exc:
            raise SourceError(f"reading topic {self.topic!r} failed: {exc!r}") from exc
        self._bound(tps, begin, end)

    def _bound(
        self,
        tps: list[TopicPartition],
        begin: dict[TopicPartition, int],
        end: dict[TopicPartition, int],
    ) -> None:
        numbers = [tp.partition for tp in tps]
        for option in (self.start_at, self.until):
            unknown = [p for p, _ in option.partitions if p not in numbers]
            if unknown:
                raise ReplayError(
                    f"{option.option} {unknown[0]}:...: topic {self.topic!r} has no partition "
                    f"{unknown[0]} (its partitions: {', '.join(map(str, numbers))})"
                )
        ends = {tp.partition: end[tp] for tp in tps}
        every = self.start_at.every
        if every is not None and all(every > e for e in ends.values()):
            raise ReplayError(
                f"--from {every} is beyond the end of every partition of topic "
                f"{self.topic!r} (end offsets {_listed(ends)}): give a lower offset"
            )
        for p, offset in self.start_at.partitions:
            if offset > ends[p]:
                raise ReplayError(
                    f"--from {p}:{offset} is beyond the end of topic {self.topic!r} partition "
                    f"{p} (end offset {ends[p]}): give an offset of at most {ends[p]}"
                )
        for tp in tps:
            given = self.start_at.of(tp.partition)
            lo = given if given is not None else self._marks.get(tp, begin[tp])
            lo = max(lo, begin[tp])  # below the start: deleted by retention
            hi = end[tp]
            until = self.until.of(tp.partition)
            if until is not None:
                hi = min(hi, until)
            self.ranges[tp] = (lo, hi)

    async def read(self) -> AsyncIterator[Held]:
        consumer = self._consumer
        for tp, (lo, hi) in self.ranges.items():
            if lo >= hi:
                continue
            consumer.seek(tp, lo)
            at, moved = lo, time.monotonic()
            while at < hi:
                try:
                    batch = await consumer.getmany(tp, timeout_ms=1000, max_records=MARK_EVERY)
                    position = await consumer.position(tp)
                except KafkaError as exc:
                    raise SourceError(
                        f"reading topic {self.topic!r} partition {tp.partition} failed: {exc!r}"
                    ) from exc
                if position > at:
                    at, moved = position, time.monotonic()
                elif time.monotonic() - moved > STALL_S:
                    raise SourceError(
                        f"reading topic {self.topic!r} partition {tp.partition}: nothing came "
                        f"past offset {at} for {STALL_S:g}s while the run's range ends at "
                        f"{hi}; is the broker reachable? Run again (the mark holds)"
                    )
                for record in batch.get(tp, []):
                    if record.offset >= hi:
                        break
                    yield Held(
                        f"{self.topic}/{tp.partition}/{record.offset}",
                        record.key,
                        record.value,
                        list(record.headers),
                        settle=self._settler(tp, record.offset),
                    )
                if batch:
                    moved = time.monotonic()  # the stall clock runs while nothing comes
            await self._commit()

    def _settler(self, tp: TopicPartition, offset: int) -> Callable[[], Awaitable[None]]:
        async def settle() -> None:
            self._done[tp] = offset + 1
            self._unmarked += 1
            if self._unmarked >= MARK_EVERY:
                await self._commit()

        return settle

    async def _commit(self) -> None:
        """The replay mark past every record confirmed so far (never moved back)."""
        ahead = {tp: n for tp, n in self._done.items() if n > self._marks.get(tp, -1)}
        self._unmarked = 0
        if not self.mark or not ahead:
            return
        try:
            await self._consumer.commit(ahead)
        except KafkaError as exc:
            raise SourceError(
                f"keeping the replay mark (group {self.group!r}, topic {self.topic!r}) failed: "
                f"{exc!r}; the records sent since the last mark go again at the next run"
            ) from exc
        self._marks.update(ahead)

    async def stop(self) -> None:
        try:
            await self._commit()
        finally:
            await self._consumer.stop()


def _listed(ends: dict[int, int]) -> str:
    return ", ".join(f"{p}:{e}" for p, e in sorted(ends.items()))
