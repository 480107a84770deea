"""Kafka sink: publishes with ``acks=all`` and idempotence, confirmed within a deadline.

Every producer streamapp makes (parking, the forwarder, the members directory, the
changelog writer) takes its options from :func:`producer_config`: ``acks="all"`` and
``enable_idempotence=True`` unless given, and never weaker. There is no setting for
them: a park or a forwarded event counts as done once the broker confirmed it, so a
leader failover must not lose it (``acks=all``), and a retried send must not duplicate
or reorder it (idempotence).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from ...engine.interfaces import SinkMetrics
from ...engine.metrics import NO_SINK_METRICS
from ...errors import ConfigError, PublishError
from ...records import Message, Receipt, refuse_headers
from ...topics import Partitioner, TopicSpec

DURABLE: Mapping[str, Any] = {"acks": "all", "enable_idempotence": True}
"""What every streamapp producer uses; :func:`producer_config` refuses anything weaker."""
_OWN = ("bootstrap_servers", "loop", "key_serializer", "value_serializer")
"""Producer options streamapp sets itself (the sink publishes bytes)."""


def producer_config(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``AIOKafkaProducer`` options: ``options`` with :data:`DURABLE` filled in.

    Raises ConfigError naming the option for a weaker ``acks`` (``0`` or ``1``),
    ``enable_idempotence=False``, an option streamapp sets itself, or an unknown name.
    """
    config = dict(options or {})
    known = set(inspect.signature(AIOKafkaProducer).parameters)
    for name in config:
        if name in _OWN:
            raise ConfigError(f"Kafka producer option {name} is streamapp's own; leave it out")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"Kafka producer option {name!r} is not an aiokafka option{hint}")
    acks = config.setdefault("acks", DURABLE["acks"])
    if acks not in ("all", -1):
        raise ConfigError(
            f"Kafka producer option acks={acks!r} is refused: streamapp counts a publish (a "
            "park, a forwarded event) as done once confirmed, so every in-sync replica must "
            "have it. Leave acks out or set acks='all'."
        )
    if config.setdefault("enable_idempotence", True) is not True:
        raise ConfigError(
            "Kafka producer option enable_idempotence=False is refused: a retried send "
            "could then be written twice or out of order. Leave it out or set it to True."
        )
    return config


class KafkaSink:
    """One idempotent producer; :meth:`publish` returns only once the broker confirmed.

    ``options`` are further ``AIOKafkaProducer`` options (e.g. ``compression_type``);
    ``acks`` and ``enable_idempotence`` may only be given at their durable values.
    ``metrics`` counts the messages not confirmed, per topic (``failed``, ``timed_out``).
    ``topics`` are the app's declared topics: a keyed message without a partition for one
    of them goes to the partition its partitioner gives (``app.topic(...,
    partitioner=...)``); aiokafka's own murmur2 places the rest.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float = 5.0,
        options: Mapping[str, Any] | None = None,
        metrics: SinkMetrics = NO_SINK_METRICS,
        setting: str = "publish_timeout_s",
        topics: Mapping[str, TopicSpec] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.setting = setting
        """The setting ``timeout_s`` comes from (errors name it)."""
        self.metrics = metrics
        self.config = producer_config({"linger_ms": 2, **(options or {})})
        """The producer's options (bootstrap aside), durable ones included."""
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **self.config)
        self._placed = {
            name: spec
            for name, spec in (topics or {}).items()
            if spec.partitioner is not Partitioner.MURMUR2
        }
        """Topics whose keys the sink places itself: their producers' partitioner is not
        aiokafka's default (murmur2, which places the rest alike)."""

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
        unknown (publish again; consumers downstream must be idempotent). Raises
        ReservedNameError for a chain or ``streamapp-`` header (:mod:`streamapp.records`).
        """
        refuse_headers(headers, f"publish to topic {topic!r}")
        partition = self._partition(topic, key, partition)
        try:
            async with asyncio.timeout(self.timeout_s):  # send() may wait for metadata too
                fut = await self._producer.send(
                    topic, value, key=key, headers=list(headers), partition=partition
                )
                await fut
        except Exception as exc:
            self.metrics.publish_failed("kafka", topic, _outcome(exc))
            raise PublishError(
                f"publish to topic {topic!r} not confirmed within {self.timeout_s:g}s "
                f"(setting {self.setting}): {exc!r}"
            ) from exc

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """Send every message (all in flight at once), then wait until all are confirmed.

        The batch has ``timeout_s`` per started thousand messages (as the RabbitMQ sink);
        past it, or on any failure, PublishError: some messages may have been written
        (publish the batch again; duplicates possible). Per partition the order of
        ``messages`` is kept (idempotent producer).
        """
        futures: list[asyncio.Future[Any]] = []
        bound = self.timeout_s * (1 + len(messages) // 1000)
        try:
            async with asyncio.timeout(bound):
                for m in messages:
                    futures.append(
                        await self._producer.send(
                            m.topic,
                            m.value,
                            key=m.key,
                            headers=list(m.headers),
                            partition=self._partition(m.topic, m.key, m.partition),
                        )
                    )
                metas = await asyncio.gather(*futures)
        except Exception as exc:
            self._count_unconfirmed(messages, futures, _outcome(exc))
            for fut in futures:
                fut.cancel()
            raise PublishError(
                f"batch of {len(messages)} messages not confirmed within {bound:g}s "
                f"(setting {self.setting}): {exc!r}"
            ) from exc
        return [Receipt(meta.topic, meta.partition, meta.offset) for meta in metas]

    def _partition(self, topic: str, key: bytes | None, partition: int | None) -> int | None:
        """``partition``, else the key's by ``topic``'s partitioner when it is not
        aiokafka's (None: aiokafka places it)."""
        if partition is not None or key is None:
            return partition
        spec = self._placed.get(topic)
        return None if spec is None else spec.partition_of(key)

    def _count_unconfirmed(
        self, messages: Sequence[Message], futures: Sequence[asyncio.Future[Any]], outcome: str
    ) -> None:
        """Count, per topic, the messages of a failed batch the broker did not confirm."""
        per_topic: dict[str, int] = {}
        for i, m in enumerate(messages):
            fut = futures[i] if i < len(futures) else None
            confirmed = (
                fut is not None and fut.done() and not fut.cancelled() and not fut.exception()
            )
            if not confirmed:
                per_topic[m.topic] = per_topic.get(m.topic, 0) + 1
        for topic, n in per_topic.items():
            self.metrics.publish_failed("kafka", topic, outcome, n)


def _outcome(exc: BaseException) -> str:
    """``timed_out`` for the sink's own deadline, ``failed`` for every other error."""
    return "timed_out" if isinstance(exc, TimeoutError) else "failed"
