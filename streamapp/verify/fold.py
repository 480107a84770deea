"""One key's stream folded again from the event store, through the app's current handler,
in scratch: the events that made a table value, and the value after each.

The fold runs the same partition task as a worker (through the in-memory broker,
:class:`~streamapp.testing.MemoryBroker`: the same lanes, outcomes, failure policies,
stream-version guard and upcasters), over memory stores, with no sink but in-memory
topics: derived events and parked copies go nowhere, live state is never read or
written. A handler with side effects of its own (an HTTP call, a file) repeats them.

It works for a table keyed by stream id (what a projection agent's write check
enforces): every event of the key's stream, read from the store's per-stream index,
reaches the agent, in stream order, as in the catch-up. A table whose agent has no history
in an event store (a plain topic, a re-keyed one: ``group_by`` and ``history=`` exclude
each other) cannot be explained this way, and says so
(:class:`~streamapp.errors.ConfigError` naming the table and the agent).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..agents.agent import Agent
from ..agents.typed import schema_version
from ..app import App
from ..errors import ConfigError
from ..eventstore.model import StoredEvent
from ..failures.outcomes import Outcome
from ..tables.table import Table
from ..testing import MemoryBroker, StuckRecordsError

MAX_EVENTS = 100_000
"""Longest stream folded in one request (a longer one is refused, naming this bound)."""


class StreamReader(Protocol):
    """What the fold reads of an event store: one stream, in stream order."""

    async def read_stream(self, stream_id: str) -> list[StoredEvent]: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One event of the stream as the fold applied it, and the value after it."""

    position: int
    """The event's store position."""
    id: str
    type: str
    stream_version: int
    schema_version: int
    """The schema version of the data as stored (1 when ``dataschema`` names none)."""
    upcasted: bool
    """The agent's upcasters ran on it (its schema version is below the model's)."""
    outcome: str
    """What the agent did with it: ``delivered``, ``filtered``, ``failed``, ``held``..."""
    value: Any
    """The key's value after the event (None: no value)."""
    error: str | None = None
    """The handler's error, when the event fails now."""

    def as_dict(self) -> dict[str, Any]:
        out = {
            "position": self.position,
            "id": self.id,
            "type": self.type,
            "stream_version": self.stream_version,
            "schema_version": self.schema_version,
            "upcasted": self.upcasted,
            "outcome": self.outcome,
            "value": self.value,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class Fold:
    """A key's stream folded up to a store position (None: its whole stream)."""

    table: Table[Any]
    key: str
    as_of: int | None
    steps: list[Step]

    @property
    def value(self) -> Any:
        """The key's value after the last event folded (None: no value)."""
        return self.steps[-1].value if self.steps else None

    @property
    def stopped(self) -> Step | None:
        """The event the fold stopped at: it fails now under the agent's policy."""
        last = self.steps[-1] if self.steps else None
        return last if last is not None and last.error is not None else None

    def explained(self, limit: int | None) -> dict[str, Any]:
        """The answer of ``?explain=1``: the value and the events that made it (the last
        ``limit`` of them when given)."""
        shown = self.steps if limit is None else self.steps[max(len(self.steps) - limit, 0) :]
        return {
            "table": self.table.name,
            "version": self.table.version,
            "key": self.key,
            "value": self.value,
            "as_of": self.as_of,
            "events_total": len(self.steps),
            "events_omitted": len(self.steps) - len(shown),
            "events": [s.as_dict() for s in shown],
            "source": "the event store, replayed through the handler in scratch",
        }


def writer_of(app: App, table: Table[Any], *, embedded: bool = False) -> Agent:
    """The agent that writes ``table``, when its values can be folded from the store
    (``embedded``: the store is every agent's source, ``STREAMAPP_BROKER=none``)."""
    agent, _ = app.tables[table.label]
    if agent.history is None and not embedded:
        raise ConfigError(
            f"table {table.label!r} cannot be explained from an event store: its agent "
            f"{agent.name!r} declares no history (history=FromEventStore(...)); its values "
            f"come from topic {agent.topic.name!r} alone"
        )
    return agent  # an agent with history reads stream ids: App refuses group_by with history


async def fold(
    app: App,
    store: StreamReader,
    table: Table[Any],
    key: str,
    *,
    as_of: int | None = None,
    through_version: int | None = None,
    embedded: bool = False,
) -> Fold:
    """Fold ``key``'s stream from ``store`` through ``table``'s agent, up to store
    position ``as_of`` and stream version ``through_version`` (its whole stream when
    None; ``embedded``: see :func:`writer_of`)."""
    agent = writer_of(app, table, embedded=embedded)
    stored = await store.read_stream(key)
    if as_of is not None:
        stored = [e for e in stored if e.position <= as_of]
    if through_version is not None:
        stored = [e for e in stored if e.version <= through_version]
    if len(stored) > MAX_EVENTS:
        raise ConfigError(
            f"stream {key!r} has {len(stored):,} events: more than {MAX_EVENTS:,} are not "
            f"folded in one request"
        )
    broker = MemoryBroker(app, max_attempts=1)
    reader = broker.table(table.label)
    steps: list[Step] = []
    for row in stored:
        event = row.event()
        written = _schema_of(agent, event)
        broker.send(agent.topic.name, event)
        error = None
        try:
            counts = await broker.process()
            outcome = _outcome_of(counts.keys())
        except StuckRecordsError as exc:
            outcome, error = Outcome.FAILED.value, exc.stuck[0].error
        steps.append(
            Step(
                position=row.position,
                id=event.id,
                type=event.type,
                stream_version=row.version,
                schema_version=written,
                upcasted=agent.events is not None
                and written < agent.events.current_version(event.type),
                outcome=outcome,
                value=reader.get(key),
                error=error,
            )
        )
        if error is not None:
            break  # the live lane stops here too (or parks: its policy, not the fold's)
    return Fold(table, key, as_of, steps)


def _schema_of(agent: Agent, event: Any) -> int:
    if agent.events is not None:
        return agent.events.schema_of(event)
    return schema_version(event) or 1


def _outcome_of(outcomes: Iterable[Outcome]) -> str:
    """The one outcome of an event's delivery (a failure before its settling one)."""
    found = list(outcomes)
    for bad in (Outcome.FAILED, Outcome.NOT_DELIVERABLE, Outcome.HELD, Outcome.REFUSED):
        if bad in found:
            return str(bad.value)
    return str(found[0].value) if found else str(Outcome.DELIVERED.value)
