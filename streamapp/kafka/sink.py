"""Kafka sink: publishes with ``acks=all`` and idempotence, confirmed within a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from ..errors import PublishError
from ..sink import Message, Receipt


class KafkaSink:
    """One idempotent producer; :meth:`publish` returns only once the broker confirmed."""

    def __init__(self, bootstrap: str, *, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=2
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        """Publish and wait for the broker's acknowledgement.

        Raises PublishError when not confirmed within ``timeout_s``: the outcome is then
        unknown (publish again; consumers downstream must be idempotent).
        """
        try:
            fut = await self._producer.send(
                topic, value, key=key, headers=list(headers), partition=partition
            )
            await asyncio.wait_for(fut, self.timeout_s)
        except Exception as exc:
            raise PublishError(
                f"publish to topic {topic!r} not confirmed within {self.timeout_s:.0f}s "
                f"(setting publish_timeout_s): {exc!r}"
            ) from exc

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """Send every message (all in flight at once), then wait until all are confirmed.

        The whole batch has ``timeout_s``; past it, or on any failure, PublishError: some
        messages may have been written (publish the batch again; duplicates possible).
        Per partition the order of ``messages`` is kept (idempotent producer).
        """
        futures: list[asyncio.Future[Any]] = []
        try:
            async with asyncio.timeout(self.timeout_s):
                for m in messages:
                    futures.append(
                        await self._producer.send(
                            m.topic, m.value, key=m.key, headers=list(m.headers)
                        )
                    )
                metas = await asyncio.gather(*futures)
        except Exception as exc:
            for fut in futures:
                fut.cancel()
            raise PublishError(
                f"batch of {len(messages)} messages not confirmed within {self.timeout_s:.0f}s "
                f"(setting publish_timeout_s): {exc!r}"
            ) from exc
        return [Receipt(meta.topic, meta.partition, meta.offset) for meta in metas]
