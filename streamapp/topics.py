"""Topic names and specs: what an app declares and needs, below everything that uses them.

A leaf module (it imports only :mod:`streamapp.events` and :mod:`streamapp.partitioner`): the
agent, the app, outputs, re-keying and every transport's topology read these, so none
of them has to import another for a topic's name or shape.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from .events import Event
from .partitioner import Partitioner, partition_for, partitioner_of

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
    ``partitioner`` is how its producers place a key (:mod:`streamapp.partitioner`):
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
    (:mod:`streamapp.repartition`)."""

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
