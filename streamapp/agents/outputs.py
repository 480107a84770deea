"""Outputs: derived events an agent sends to the topics it declares (``sinks=[...]``).

A handler that declares sinks takes a keyword-only parameter ``send`` (a :class:`Send`)
and calls ``send(topic, event)`` for each derived event. Nothing leaves the process
then: sends are buffered per event like table writes (an :class:`Outbox`), dropped when
the handler raises (its table writes are rolled back with them), and published with
the batch's commit:

- Kafka: in the partition's transaction, with its changelog records and its source
  offsets, so a ``read_committed`` consumer sees each derived event exactly once.
- RabbitMQ: confirmed publishes before the batch's store write and acks (at least once).
- the memory broker: appended to its in-memory topics.

A derived event is a CloudEvent keyed by its stream id, on the partition the one
partitioner gives it among the topic's declared partitions. With tracing on, a derived
event without a trace context of its own gets its handler's: the span of the delivery
that sent it (:mod:`streamapp.tracing`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import tracing
from ..codecs import plain
from ..errors import OutputError
from ..events import Event
from ..failures.retry_chain import delayed
from ..records import Message, first_reserved, suggestion
from ..topics import TopicSpec, delay_topic
from .typed import EventTypes

log = logging.getLogger("streamapp.agent")

Encoder = Callable[[Event], tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]
"""``event -> (key, value, headers)`` in a transport's wire format (binary content mode)."""


class Send:
    """What a handler's ``send`` parameter receives: ``send(topic, event)``.

    ``topic`` is one of the agent's ``sinks=[...]`` (the spec ``app.topic(...)`` returned,
    or its name). The event is buffered, not published: it goes out with the batch's
    commit, and never when the handler raises. ``delay_s`` asks for a delivery that
    many seconds later; setting ``delayed_policy`` decides: ``immediate`` (sent now, with
    a warning), ``reject`` (OutputError: the send fails), ``relay`` (held in
    ``{topic}-delay`` until due, then republished to ``topic`` by the relay).
    """

    __slots__ = (
        "_agent", "_encode", "_outbox", "_sinks", "_trace", "_types", "clock", "delayed_policy"
    )  # fmt: skip

    def __init__(
        self,
        agent: str,
        sinks: Sequence[TopicSpec],
        encode: Encoder,
        outbox: Outbox,
        types: EventTypes | None = None,
    ) -> None:
        self._agent, self._encode, self._outbox = agent, encode, outbox
        self._types = types
        """The agent's event models: a registered model is sent as its type's event."""
        self._sinks = {spec.name: spec for spec in sinks}
        self.delayed_policy = "immediate"
        self.clock: Callable[[], float] = time.time
        self._trace = tracing.active()
        """Tracing on: a sent event without a trace context gets its handler's span's."""

    def __call__(
        self,
        topic: TopicSpec | str,
        event: Event | Any,
        *,
        delay_s: float | None = None,
        stream_id: str | None = None,
        id: str | None = None,
        version: int | None = None,
    ) -> None:
        name = topic if isinstance(topic, str) else getattr(topic, "name", None)
        spec = self._sinks.get(name) if isinstance(name, str) else None
        if spec is None:
            declared = ", ".join(sorted(self._sinks)) or "none"
            raise OutputError(
                f"agent {self._agent!r} sends to topic {name or topic!r}, which it does not "
                f"declare (its sinks: {declared}); add it to sinks=[...] of @app.agent"
            )
        if not isinstance(event, Event):
            event = self._from_model(spec, event, stream_id, id, version)
        if event.extensions and (found := first_reserved(event.extensions)) is not None:
            name, why = found
            raise OutputError(
                f"agent {self._agent!r}: event {event.id} sent to {spec.name!r} has extension "
                f"{name!r}, a reserved name ({why}); give it a plain name such as "
                f"{suggestion(name)!r} (lower case letters and digits)"
            )
        sid = event.stream_id
        if not sid:
            raise OutputError(
                f"agent {self._agent!r}: event {event.id} sent to {spec.name!r} has no stream "
                "id (streamid or subject): it is the message key and picks the partition"
            )
        if self._trace is not None:
            event = self._trace.stamp(event, f"send {spec.name}")
        if spec.plain:
            try:
                key, value, headers = plain.encode(spec, event)
            except TypeError as exc:
                raise OutputError(f"agent {self._agent!r}: {exc}") from None
        else:
            key, value, headers = self._encode(event)
        partition = spec.partition_of(sid.encode())
        message = Message(spec.name, value, key, headers, partition)
        if delay_s is not None and delay_s > 0:
            message = self._delayed(message, event, delay_s)
        self._outbox.add(message)

    def _from_model(
        self,
        spec: TopicSpec,
        model: Any,
        stream_id: str | None,
        id: str | None,
        version: int | None,
    ) -> Event:
        """The event of a registered model (``events=`` of the agent)."""
        if self._types is None:
            raise OutputError(
                f"agent {self._agent!r}: send({spec.name!r}, ...) takes an Event, not "
                f"{type(model).__name__}; build one with Event.create(type, stream_id=...), or "
                "register the model in the agent's events= to send it as is"
            )
        if not stream_id:
            raise OutputError(
                f"agent {self._agent!r}: send({spec.name!r}, {type(model).__name__}(...)) needs "
                "stream_id=...: it is the event's stream, its message key and its partition"
            )
        try:
            return self._types.to_event(model, stream_id=stream_id, id=id, version=version)
        except (TypeError, ValueError) as exc:
            raise OutputError(f"agent {self._agent!r}: send({spec.name!r}, ...): {exc}") from None

    def _delayed(self, message: Message, event: Event, delay_s: float) -> Message:
        policy, topic = self.delayed_policy, message.topic
        if policy == "reject":
            raise OutputError(
                f"agent {self._agent!r}: send({topic!r}, ..., delay_s={delay_s:g}) refused: "
                "setting delayed_policy (STREAMAPP_DELAYED_POLICY) = 'reject'. Set it to "
                "'relay' (and run `streamapp topics create` for the delay topics) or "
                "'immediate', or send without delay_s"
            )
        if policy == "relay":
            return delayed(message, delay_topic(topic), self.clock() * 1000, delay_s)
        log.warning(
            "agent %s: event %s to %s sent now, not in %gs: setting delayed_policy is "
            "'immediate' (set it to 'relay' for delayed delivery)",
            self._agent,
            event.id,
            topic,
            delay_s,
        )
        return message

    def rekeyed(self, topic: TopicSpec, event: Event, key: str) -> None:
        """Buffer ``event`` for ``topic`` keyed by ``key`` instead of its stream id (its
        body keeps the stream id): what a re-keyed agent's forwarder sends (``group_by``)."""
        spec = self._sinks.get(topic.name)
        if spec is None:
            raise OutputError(f"agent {self._agent!r} does not declare topic {topic.name!r}")
        raw = key.encode()
        if self._trace is not None:
            event = self._trace.stamp(event, f"send {spec.name}")
        _, value, headers = self._encode(event)
        self._outbox.add(Message(spec.name, value, raw, headers, spec.partition_of(raw)))


class Outbox:
    """One agent's sends in one partition: the open event's, then the open batch's."""

    __slots__ = ("_batch", "_event")

    def __init__(self) -> None:
        self._event: list[Message] = []
        self._batch: list[Message] = []

    def add(self, message: Message) -> None:
        self._event.append(message)

    def settle(self, message: Message) -> None:
        """Add ``message`` to the open batch at once (a copy of the retry chain)."""
        self._batch.append(message)

    def commit_event(self) -> None:
        if self._event:
            self._batch.extend(self._event)
            self._event.clear()

    def rollback_event(self) -> None:
        self._event.clear()

    def take(self) -> list[Message]:
        """The open batch's sends, in send order (the outbox is emptied)."""
        taken, self._batch = self._batch, []
        return taken

    def drop(self) -> None:
        """Forget everything not committed (a failed commit)."""
        self._event.clear()
        self._batch.clear()
