"""Re-keying, as Faust's ``group_by``: an agent consumes its topic re-keyed by a function
of the event.

``@app.agent(orders, group_by=lambda e: e.data["customer"], tables=[totals])`` registers
two agents (:meth:`streamapp.app.App.agent`):

- **the forwarder** ``{agent}.group_by`` on ``orders`` (no tables): it applies the
  agent's ``filter``, calls the key function and sends the event, unchanged (id, stream
  id and stream version stay in the body), keyed by the function's value, to the
  internal repartition topic ``{app}-{agent}-repartition``, on the partition the one
  partitioner gives that key. It is an agent with a sink, so its sends go out with the
  source partition's commit (:mod:`streamapp.engine.commit`): on Kafka the forward and
  the source offset are one transaction (exactly once downstream of ``read_committed``);
  the memory broker appends to its in-memory topic. A key function that raises or
  returns something else than a non-empty ``str`` fails the event under the agent's
  failure policy, with a :class:`~streamapp.errors.GroupByError` naming the agent and the
  event (data that is not JSON, read by the key function, is NOT_DELIVERABLE).
- **the agent itself** on the repartition topic: its tables are partitioned by the new
  key (a per-customer total writes ``totals[customer]``), and views route a key to the
  owner of the repartition topic's partition of that key.

**Stream versions.** The version guard stays keyed by the event's stream id, recorded in
the repartitioned agent's partition: it dedupes by (stream id, version) within a
partition of the repartition topic. That is sound because all events of one stream come
from one source partition, whose forwarder sends them in order, so the events of a
stream that reach one repartition partition arrive in version order (a stream whose
events map to several keys leaves an increasing subsequence in each partition).

RabbitMQ and ``STREAMAPP_BROKER=none`` are refused (their transports' capabilities,
:func:`streamapp.transports.base.refuse_unsupported`): a RabbitMQ partition with tables
restores through the event-store replay, which is partitioned by stream id, not by the
key function; and the store alone has no topic to re-key through.
For the same reason ``history=`` is refused with ``group_by``.
"""

from __future__ import annotations

from ..errors import ConfigError, DataError, GroupByError
from ..events import Event
from ..topics import GroupBy, KeyFunction
from .agent import Handler
from .outputs import Send


def forwarder_name(agent: str) -> str:
    """The name of ``agent``'s forwarding agent (shown in status, metrics, park headers)."""
    return f"{agent}.group_by"


def check_key_function(agent: str, key: object) -> KeyFunction:
    """``key`` as a key function, or ConfigError naming the agent."""
    if isinstance(key, str) or not callable(key):
        raise ConfigError(
            f"agent {agent!r}: group_by={key!r} is not a function; pass a function of the "
            "event that returns its new key, e.g. group_by=lambda e: e.data['customer']"
        )
    return key


def key_of(agent: str, key: KeyFunction, event: Event) -> str:
    """The new key of ``event``, or GroupByError naming the agent and the event."""
    try:
        value = key(event)
    except DataError:
        raise  # its data cannot be read: NOT_DELIVERABLE, as in any handler
    except Exception as exc:
        raise GroupByError(
            f"agent {agent!r}: group_by raised {type(exc).__name__}: {exc} for event "
            f"{event.id} (stream {event.stream_id})"
        ) from exc
    if not isinstance(value, str) or not value:
        raise GroupByError(
            f"agent {agent!r}: group_by returned {value!r} for event {event.id} (stream "
            f"{event.stream_id}); the new key must be a non-empty str"
        )
    return value


def forwarding_handler(agent: str, group_by: GroupBy) -> Handler:
    """The handler of ``agent``'s forwarder: the event to the repartition topic, keyed by
    ``group_by.key``."""
    key, topic = group_by.key, group_by.topic

    async def forward(event: Event, *, send: Send) -> None:
        send.rekeyed(topic, event, key_of(agent, key, event))

    forward.__name__ = forward.__qualname__ = group_by.forwarder
    return forward
