"""The partition port on Kafka: pause, resume, seek and commit one assigned partition.

A commit may carry, in the offset's metadata, the agents of the topic that are ahead of
the committed offset (several agents on one topic, :mod:`streamapp.engine.lane`):
``{"streamapp": 1, "ahead": {agent: next offset}}`` as JSON. :meth:`committed` reads it
back, so a restart does not run a record again through an agent that had settled it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import IllegalStateError, KafkaError

from ...engine.interfaces import NO_LANES, Committed
from ...errors import SourceError
from .commits import OffsetCommits

log = logging.getLogger("streamapp.partition")


def offset_metadata(ahead: Mapping[str, int]) -> str:
    """The metadata of a committed offset: the agents ahead of it ("" when none)."""
    if not ahead:
        return ""
    return orjson.dumps({"streamapp": 1, "ahead": dict(ahead)}).decode()


def parse_metadata(metadata: str | None) -> dict[str, int]:
    """The agents ahead of a committed offset, from its metadata (anything else: none)."""
    if not metadata:
        return {}
    try:
        body = orjson.loads(metadata)
        ahead = body["ahead"] if isinstance(body, dict) and body.get("streamapp") == 1 else {}
        return {str(k): int(v) for k, v in ahead.items()}
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return {}


class KafkaPartitionPort:
    """One assigned partition of the group member's consumer."""

    absolute = True

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        reset: str,
        *,
        admin: AIOKafkaAdminClient | None = None,
        group_id: str = "",
        commits: OffsetCommits | None = None,
    ) -> None:
        self.consumer, self.tp, self.reset = consumer, tp, reset
        self.admin, self.group_id, self.commits = admin, group_id, commits
        self.name = f"{tp.topic}[{tp.partition}]"

    def pause(self) -> None:
        self._quietly(self.consumer.pause, self.tp)

    def resume(self) -> None:
        self._quietly(self.consumer.resume, self.tp)

    def rewind(self, position: int) -> None:
        self._quietly(self.consumer.seek, self.tp, position)

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        """Commit ``position``: only the task calls it, once the batch is durable. With
        coalesced commits (:class:`~streamapp.transports.kafka.commits.OffsetCommits`) it returns
        at once: the commit goes out with the other partitions'."""
        if self.commits is not None:
            self.commits.record(self.tp, position, offset_metadata(ahead))
            return
        try:
            await self.consumer.commit({self.tp: (position, offset_metadata(ahead))})
        except KafkaError as exc:  # not owned any more, or the group moved on
            log.info(
                "%s: offset commit %d skipped (%r); the table checkpoint holds",
                self.name,
                position,
                exc,
            )

    async def committed(self) -> Committed | None:
        if self.admin is None:
            return None
        try:
            found = await self.admin.list_consumer_group_offsets(
                self.group_id, partitions=[self.tp]
            )
        except KafkaError as exc:
            raise SourceError(f"{self.name}: cannot read the committed offset: {exc!r}") from exc
        meta = found.get(self.tp)
        if meta is None or meta.offset < 0:
            return None
        return Committed(int(meta.offset), parse_metadata(meta.metadata))

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        try:
            return await self._begin(position, stateful, earliest)
        except KafkaError as exc:
            raise SourceError(f"{self.name}: cannot start live delivery: {exc!r}") from exc

    async def _begin(self, position: int | None, stateful: bool, earliest: bool) -> int:
        if position is None and not stateful:  # no state: the group's committed offset
            return int(await self.consumer.position(self.tp))
        if position is not None:
            self.rewind(position)
            return position
        reset = "earliest" if earliest else self.reset
        if reset == "earliest":  # a new table: built from the topic, not the group
            await self.consumer.seek_to_beginning(self.tp)
        else:
            await self.consumer.seek_to_end(self.tp)
        start = int(await self.consumer.position(self.tp))
        log.debug("%s has no checkpoint: starts at the %s offset %d", self.name, reset, start)
        return start

    async def through(self, position: int) -> int:
        """The consumer's position when it is past ``position`` (it skipped a commit
        marker or an aborted batch after the last record it handed out)."""
        try:
            consumed = int(await self.consumer.position(self.tp))
        except Exception as exc:  # not assigned any more: the checkpoint holds
            log.debug("%s: no position (%r)", self.name, exc)
            return position
        return max(position, consumed)

    def end(self) -> int | None:
        """The end a read-committed consumer can fetch up to, from the last fetch response
        (no request): the last stable offset, else the high watermark. Records of a
        transaction still open upstream are not there yet (no lag, no stall for them)."""
        try:
            stable = self.consumer.last_stable_offset(self.tp)
            end = self.consumer.highwater(self.tp)
        except IllegalStateError:  # not assigned any more
            return None
        if stable is not None and stable >= 0:
            return int(stable) if end is None else min(int(stable), int(end))
        return None if end is None else int(end)

    def _quietly(self, call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except IllegalStateError as exc:  # not assigned any more: nothing to do
            log.debug("%s: %r", self.name, exc)
