"""The retry chain's wire contract: the headers its copies carry and how a lane makes them.

Below the engine and every transport (it knows only records and the ``Retry`` policy,
whose ``retry_suffix`` and ``dlq_suffix`` name the topics), so lanes, outputs, relays
and the memory broker share it without importing one another.

A delivery that fails under :class:`~streamapp.failures.outcomes.Retry` is tried again in place
(:mod:`streamapp.engine.lane`), then copied to ``{topic}-retry`` (:func:`retry_copy`, on the
partition of the original: the retry topic has the source's partition count, checked at
start) or, once its failures are spent, to ``{topic}-dlq`` (:func:`dead_letter`, routed
by key over the dead-letter topic's own partitions, whatever their count). The relay
(:mod:`streamapp.transports.kafka.relay`, :mod:`streamapp.transports.rabbitmq.relay`
and the memory broker's) republishes a due copy to its origin topic
(:func:`republished`). The copy goes out with the batch's commit (Kafka: in its
transaction with the table checkpoints, or with the offset for an agent without tables;
RabbitMQ: a confirmed publish before the store write and the acks), so the original is
settled only with its copy.

Header contract (values are ASCII decimal numbers or names):

- ``x-reconsume``: failures so far, the first delivery's included;
- ``x-retry-hop``: round trips through the retry topic (1-based);
- ``x-deliver-at``: epoch milliseconds when the copy is due (retry and delay topics);
- ``x-origin-topic``: the topic the relay republishes to;
- ``x-retry-agent``: the agent the copy is for (other agents of the topic, which
  settled the original, skip it when it comes back);
- dead-letter copies add ``x-dlq-reason`` (the last failure) and ``x-origin``
  (``topic/partition/offset`` of the failed delivery).

Every other header (the CloudEvent's, the business's) is kept along the whole chain.
"""

from __future__ import annotations

from ..records import Delivery, Headers, Message, Stamped
from .outcomes import Retry

RECONSUME = "x-reconsume"
HOP = "x-retry-hop"
DELIVER_AT = "x-deliver-at"
ORIGIN_TOPIC = "x-origin-topic"
AGENT = "x-retry-agent"
REASON = "x-dlq-reason"
ORIGIN = "x-origin"
CHAIN = frozenset({RECONSUME, HOP, DELIVER_AT, ORIGIN_TOPIC, AGENT, REASON, ORIGIN})
"""Headers the chain writes: replaced, never repeated, at each step; reserved for it
(:data:`streamapp.records.CHAIN`): an application cannot send them."""


def header(headers: Headers, name: str) -> bytes | None:
    """The first value of header ``name`` (None: absent)."""
    for key, value in headers:
        if key == name:
            return value
    return None


def _number(headers: Headers, name: str) -> int:
    raw = header(headers, name)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def chain_state(headers: Headers) -> tuple[int, int]:
    """``(failures so far, round trips so far)`` of a delivery (0, 0 when new)."""
    return _number(headers, RECONSUME), _number(headers, HOP)


def hop_of(headers: Headers) -> int:
    """The ``x-retry-hop`` a chain copy carries (0: none; metrics' hop histogram)."""
    return _number(headers, HOP)


def due_ms(headers: Headers) -> int | None:
    """When a retry or delay copy is due (epoch ms; None: not a chain copy)."""
    raw = header(headers, DELIVER_AT)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def business(headers: Headers) -> list[tuple[str, bytes]]:
    """``headers`` without the chain's own."""
    return [(k, v) for k, v in headers if k not in CHAIN]


def retry_copy(
    record: Delivery, policy: Retry, agent: str, failures: int, hop: int, now_ms: float
) -> Message:
    """The copy of ``record`` for round trip ``hop + 1``, due after its back-off."""
    topic = policy.retry_topic(record.topic)
    assert topic is not None
    due = int(now_ms + policy.backoff_s(hop + 1) * 1000)
    return Message(
        topic,
        record.value,
        record.key,
        Stamped(
            [
                *business(record.headers),
                (RECONSUME, str(failures).encode()),
                (HOP, str(hop + 1).encode()),
                (DELIVER_AT, str(due).encode()),
                (ORIGIN_TOPIC, record.topic.encode()),
                (AGENT, agent.encode()),
            ]
        ),
        record.partition,
    )


def dead_letter(
    record: Delivery, policy: Retry, agent: str, failures: int, hop: int, reason: str
) -> Message:
    """The copy of ``record`` for the dead-letter topic, with why and where from."""
    origin = f"{record.topic}/{record.partition}/{record.position}"
    return Message(
        policy.dlq_topic(record.topic),
        record.value,
        record.key,
        Stamped(
            [
                *business(record.headers),
                (RECONSUME, str(failures).encode()),
                (HOP, str(hop).encode()),
                (ORIGIN_TOPIC, record.topic.encode()),
                (AGENT, agent.encode()),
                (REASON, reason.encode(errors="replace")),
                (ORIGIN, origin.encode()),
            ]
        ),
        None,  # the key's partition of the dead-letter topic (any partition count)
    )


def delayed(message: Message, delay_topic: str, now_ms: float, delay_s: float) -> Message:
    """``message`` held in ``delay_topic`` until ``delay_s`` from now (policy relay)."""
    due = int(now_ms + delay_s * 1000)
    headers = Stamped(
        [
            *business(message.headers),
            (DELIVER_AT, str(due).encode()),
            (ORIGIN_TOPIC, message.topic.encode()),
        ]
    )
    return Message(delay_topic, message.value, message.key, headers)


def republished(topic: str, value: bytes | None, key: bytes | None, headers: Headers) -> Message:
    """What the relay sends back to the origin topic: the copy without ``x-deliver-at``
    and ``x-origin-topic`` (``x-reconsume``, ``x-retry-hop``, the agent and every other
    header kept). The partition is the key's (the one partitioner)."""
    kept = Stamped((k, v) for k, v in headers if k not in (DELIVER_AT, ORIGIN_TOPIC))
    return Message(topic, value, key, kept)
