"""What streamapp asks of tracing, in its own small types (no OpenTelemetry type here).

The engine, the sinks' callers, the event store, the forwarder and the views hold one of
these, or None when tracing is off (decided once, at start: :func:`streamapp.tracing.active`);
the one implementation is :mod:`streamapp.tracing.otel`. Every method swallows its own
errors: tracing never fails an event, an append or a request.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from ..errors import DecodeError
from ..events import Event
from ..records import Delivery


class Valued(Protocol):
    """An outcome (:class:`streamapp.failures.outcomes.Outcome`): its ``value`` names it."""

    @property
    def value(self) -> str: ...


class Result(Protocol):
    """How one attempt at a delivery went (:class:`streamapp.agents.agent.Handled`)."""

    @property
    def outcome(self) -> Valued: ...
    @property
    def reason(self) -> str: ...
    @property
    def error(self) -> BaseException | None: ...


class LaneTrace(Protocol):
    """One lane's spans (an agent in one partition task): one per handled delivery, the
    delivery's failure policy included, and its task's one per batch commit."""

    def start(self, record: Delivery, item: Event | DecodeError, attempt: int) -> None:
        """A span for ``record`` begins, the child of its event's trace context (a new
        trace without one, or with one that is not valid); it is the current span until
        :meth:`end`, so the handler's own spans and its sends belong to it."""

    def end(self, result: Result, settled: bool) -> None:
        """The span of :meth:`start` ends with ``result`` (its outcome, its error) and
        whether the delivery is settled for this lane (a park, a retry copy)."""

    def abandon(self) -> None:
        """End a span left open by a run that raised (a store error, a cancellation)."""

    def committing(self, settle_at: int | None) -> AbstractContextManager[None]:
        """The span of the task's batch commit (nothing when the batch handled nothing
        since the last commit): the child of the first delivery handled, linking the rest."""


class TaskTrace(Protocol):
    """The spans of one partition task: its lanes' and its commits'."""

    def lane(self, agent: str) -> LaneTrace: ...


class AppendTrace(Protocol):
    """The span of one append to the event store."""

    def stamp(self, event: Event) -> Event:
        """``event`` with the append's trace context, unless it carries a valid one."""

    def appended(self, events: int, skipped: int, error: str | None) -> None: ...


class Answer(Protocol):
    """The span of one HTTP request, served or sent."""

    def answered(self, status: int) -> None: ...


class Tracer(Protocol):
    """streamapp's spans (see ``docs/tracing.md``)."""

    def task(self, name: str) -> TaskTrace:
        """The spans of partition task ``name``."""

    def stamp(self, event: Event, name: str) -> Event:
        """``event`` as it is when it carries a valid trace context, else with the
        current span's (a handler's send: its delivery's span), else with that of a new
        span ``name`` (a new trace)."""

    def append(self, events: int, system: str) -> AbstractContextManager[AppendTrace]:
        """The span of an append of ``events`` to an event store of ``system``."""

    def forwarded(
        self, events: Sequence[tuple[Event, int]], topics: Sequence[str], started_ns: int
    ) -> None:
        """One span per ``(event, store position)`` the forwarder published to ``topics``
        and the broker confirmed, from ``started_ns`` (:func:`time.time_ns`) to now."""

    def serve(
        self, name: str, headers: Mapping[str, str], attributes: Mapping[str, str | int]
    ) -> AbstractContextManager[Answer]:
        """The span of a request served, the child of its W3C ``traceparent`` header."""

    def ask(
        self, name: str, headers: MutableMapping[str, str], attributes: Mapping[str, str | int]
    ) -> AbstractContextManager[Answer]:
        """The span of a request sent (a view lookup asked of the key's owner); its
        context goes into ``headers`` (``traceparent``, ``tracestate``)."""
