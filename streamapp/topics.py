"""Topics: their names and specs, and the partitioner that places a key on one of them.

A leaf module (it imports only :mod:`streamapp.events`): the agent, the app, outputs,
re-keying and every transport's topology read these, so none of them has to import
another for a topic's name, shape or partition.

The partitioners: which partition a key belongs to, for every transport and view.

A topic names the partitioner its producers use (``app.topic(..., partitioner=...)``),
and everything that places a key of that topic uses the same one: the table write
check, view routing, the event-store replay's share of each partition, the sinks and
the RabbitMQ router.

- ``murmur2`` (the default): Kafka's default partitioner, murmur2 of the key bytes,
  sign bit cleared, modulo the partition count. What Kafka's Java client, Quix Streams,
  kafkajs, aiokafka and streamapp's own sinks use.
- ``crc32``: librdkafka's default (``consistent_random``: CRC-32 of the key bytes,
  unsigned, modulo the partition count), what confluent-kafka (Python, Go, .NET),
  kcat and the C and Node clients built on librdkafka use unless told otherwise. For a
  null or empty key librdkafka picks a random partition: such records cannot be placed
  by key at all.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from .events import Event

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


class Partitioner(enum.StrEnum):
    """How a topic's producers pick a key's partition (``app.topic(..., partitioner=...)``)."""

    MURMUR2 = "murmur2"
    """Kafka's default (Java client, Quix Streams, kafkajs, aiokafka, streamapp's sinks)."""
    CRC32 = "crc32"
    """librdkafka's default, ``consistent_random`` (confluent-kafka, kcat, librdkafka
    clients in Go, C, .NET, Node), for records with a key."""


def partitioner_of(topic: str, value: str) -> Partitioner:
    """``value`` as a :class:`Partitioner`, or ValueError naming the topic and the choices."""
    try:
        return Partitioner(value)
    except ValueError:
        choices = ", ".join(repr(p.value) for p in Partitioner)
        raise ValueError(
            f"topic {topic!r}: partitioner={value!r} is not one of {choices}: name the "
            "partitioner the topic's producers use ('murmur2': Kafka's Java client, Quix "
            "Streams, kafkajs; 'crc32': librdkafka's default, confluent-kafka and kcat)"
        ) from None


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(
    key: bytes, partitions: int, partitioner: Partitioner = Partitioner.MURMUR2
) -> int:
    """The partition of ``key`` among ``partitions`` by ``partitioner`` (default:
    Kafka's murmur2; ``CRC32``: librdkafka's ``consistent_random`` for a keyed record)."""
    if partitioner is Partitioner.CRC32:
        return zlib.crc32(key) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions


KeyFunction = Callable[[Event], str]
"""``event -> key``: the new key of an event (a non-empty ``str``; ``group_by=``)."""


class TopicFormat(enum.StrEnum):
    """What a topic's records are (``app.topic(..., format=...)``)."""

    CLOUDEVENTS = "cloudevents"
    """CloudEvents, binary or structured (the default; what the forwarder writes)."""
    JSON = "json"
    """Plain records: a JSON value, the stream id in the key (or a field of the value)."""
    RAW = "raw"
    """Plain records: the value's bytes as they are, the stream id in the key."""


def topic_format(topic: str, value: str) -> TopicFormat:
    """``value`` as a :class:`TopicFormat`, or ValueError naming the topic and the choices."""
    try:
        return TopicFormat(value)
    except ValueError:
        formats = ", ".join(repr(f.value) for f in TopicFormat)
        raise ValueError(f"topic {topic!r}: format={value!r} is not one of {formats}") from None


@dataclass(frozen=True)
class TopicSpec:
    """A declared topic: its name and partition count (tables are partitioned alike), and
    what its records are: CloudEvents, or plain records (:mod:`streamapp.codecs.plain`)
    whose event type is ``type_field`` of the value (else the topic's name) and whose
    stream id is ``stream_id_field`` of the value (else the record's key).
    ``partitioner`` is how its producers place a key (:mod:`streamapp.topics`):
    everything that asks which partition a key of this topic belongs to asks it."""

    name: str
    partitions: int = 8
    format: TopicFormat = TopicFormat.CLOUDEVENTS
    type_field: str | None = None
    stream_id_field: str | None = None
    partitioner: Partitioner = Partitioner.MURMUR2

    def __post_init__(self) -> None:
        if not self.name or self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: a name and at least one partition are needed")
        fmt = topic_format(self.name, self.format)
        object.__setattr__(self, "format", fmt)  # a str given is kept as its member
        object.__setattr__(self, "partitioner", partitioner_of(self.name, self.partitioner))
        fields = [f for f in ("type_field", "stream_id_field") if getattr(self, f) is not None]
        if fields and fmt is not TopicFormat.JSON:
            raise ValueError(
                f"topic {self.name!r}: {', '.join(fields)} name fields of a JSON value; "
                f"they need format='json' (format is {fmt.value!r})"
            )
        for f in fields:
            if not getattr(self, f):
                raise ValueError(f"topic {self.name!r}: {f} is empty; name a field or omit it")

    @property
    def plain(self) -> bool:
        """True when its records are not CloudEvents."""
        return self.format is not TopicFormat.CLOUDEVENTS

    def partition_of(self, key: bytes) -> int:
        """The partition ``key`` belongs to: where the topic's producers put it."""
        return partition_for(key, self.partitions, self.partitioner)


@dataclass(frozen=True)
class GroupBy:
    """How an agent is re-keyed: the key function, the topic it reads from and the
    repartition topic it consumes, and the name of its forwarding agent
    (:mod:`streamapp.agents.group_by`)."""

    key: KeyFunction
    source: TopicSpec
    topic: TopicSpec
    forwarder: str


class TopicRole(enum.StrEnum):
    """Why the app needs a topic (``streamapp topics create`` prints it)."""

    SOURCE = "source"
    """Feeds agents."""
    OUTPUT = "output"
    """Agents send derived events to it (``sinks=[...]``) and no agent of the app reads it."""
    CHANGELOG = "changelog"
    """An agent's tables, compacted."""
    PARKING = "parking"
    """Where a failure policy parks records."""
    REPARTITION = "repartition"
    """Internal: a re-keyed agent's forwarder sends to it, the agent consumes it
    (``group_by=``)."""
    RETRY = "retry"
    """Copies of failed records waiting for the relay (``Retry``: ``{topic}-retry``)."""
    DEAD_LETTER = "dead-letter"
    """Records whose retries are spent (``Retry``: ``{topic}-dlq``)."""
    DELAY = "delay"
    """Derived events sent with a delay, waiting for the relay (``{topic}-delay``,
    setting ``delayed_policy=relay``)."""
    MEMBERS = "members"
    """Where workers say which partitions they own (views forward through it)."""


@dataclass(frozen=True)
class TopicPlan:
    """A topic the app needs: what ``streamapp topics create`` makes."""

    name: str
    partitions: int
    compacted: bool = False
    role: TopicRole = TopicRole.SOURCE


def relayed(plan: list[TopicPlan]) -> list[TopicPlan]:
    """The topics of ``plan`` the relay consumes (retry and delay topics)."""
    return [p for p in plan if p.role in (TopicRole.RETRY, TopicRole.DELAY)]


def changelog_topic(app_id: str, agent: str) -> str:
    """The compacted changelog topic of ``agent``'s tables."""
    return f"{app_id}-{agent}-changelog"


def repartition_topic(app_id: str, agent: str) -> str:
    """The internal repartition topic of ``agent`` (made by ``streamapp topics create``)."""
    return f"{app_id}-{agent}-repartition"


def delay_topic(topic: str) -> str:
    """Where derived events for ``topic`` sent with a delay wait (``delayed_policy=relay``)."""
    return f"{topic}-delay"


def members_topic(app_id: str) -> str:
    """The compacted topic where workers say which partitions they own and where their
    views answer (views forward a key to its owner through it)."""
    return f"{app_id}-members"
