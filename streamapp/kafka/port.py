"""The partition port on Kafka: pause, resume, seek and commit one assigned partition."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from ..errors import SourceError

log = logging.getLogger("streamapp.partition")


class KafkaPartitionPort:
    """One assigned partition of the group member's consumer."""

    def __init__(self, consumer: AIOKafkaConsumer, tp: TopicPartition, reset: str) -> None:
        self.consumer, self.tp, self.reset = consumer, tp, reset
        self.name = f"{tp.topic}[{tp.partition}]"

    def pause(self) -> None:
        self._quietly(self.consumer.pause, self.tp)

    def resume(self) -> None:
        self._quietly(self.consumer.resume, self.tp)

    def rewind(self, position: int) -> None:
        self._quietly(self.consumer.seek, self.tp, position)

    async def settle(self, position: int) -> None:
        """Commit ``position``: only the task calls it, once the batch is durable."""
        try:
            await self.consumer.commit({self.tp: position})
        except KafkaError as exc:  # not owned any more, or the group moved on
            log.info(
                "%s: offset commit %d skipped (%r); the table checkpoint holds",
                self.name,
                position,
                exc,
            )

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
            # The store may be ahead of the group (killed between store write and
            # commit): commit what is durable so that lag reads true.
            await self.settle(position)
            return position
        reset = "earliest" if earliest else self.reset
        if reset == "earliest":  # a new table: built from the topic, not the group
            await self.consumer.seek_to_beginning(self.tp)
        else:
            await self.consumer.seek_to_end(self.tp)
        start = int(await self.consumer.position(self.tp))
        log.info("%s has no checkpoint: starts at the %s offset %d", self.name, reset, start)
        return start

    def end(self) -> int | None:
        """The high watermark from the last fetch response (no request)."""
        try:
            end = self.consumer.highwater(self.tp)
        except IllegalStateError:  # not assigned any more
            return None
        return None if end is None else int(end)

    def _quietly(self, call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except IllegalStateError as exc:  # not assigned any more: nothing to do
            log.debug("%s: %r", self.name, exc)
