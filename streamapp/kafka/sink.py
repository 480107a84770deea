"""Kafka sink: publishes with ``acks=all`` and idempotence, confirmed within a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from ..errors import PublishError


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
