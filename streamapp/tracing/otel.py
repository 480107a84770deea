"""streamapp's spans on OpenTelemetry: the one module of streamapp that makes spans.

Imported only once tracing is on (:func:`streamapp.tracing.start`), so a worker without
the ``otel`` extra, or without tracing configured, never imports OpenTelemetry. The
trace context of an event is the CloudEvents distributed-tracing extension
(``traceparent``, ``tracestate``), read and written with the W3C propagator; HTTP
requests carry theirs in the headers of the process's propagator (``OTEL_PROPAGATORS``,
W3C trace context by default). A span never raises into the code it describes: an
error of OpenTelemetry's is logged once and the work goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._version import streamapp_version
from ..errors import DecodeError
from ..events import TRACE_CONTEXT, TRACEPARENT, Event
from ..records import Delivery
from .api import AppendTrace, Result

log = logging.getLogger("streamapp.tracing")

W3C = TraceContextTextMapPropagator()
"""Reads and writes the ``traceparent`` and ``tracestate`` of an event's extensions."""
MAX_LINKS = 128
"""Links of a commit span to the deliveries of its batch beyond the first (the SDK's
default limit per span)."""
FAILED = frozenset({"failed", "not_deliverable", "refused"})
"""Outcomes whose span has status ERROR."""


def app_configured() -> bool:
    """The application set a TracerProvider of its own (e.g. ``opentelemetry-instrument``
    or the SDK in its code): streamapp's spans go to it."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def context_of(extensions: Mapping[str, str]) -> Context:
    """The trace context an event carries: its ``traceparent`` (and ``tracestate``),
    else an empty context (a span started in it starts a new trace), also for a
    ``traceparent`` that is not valid W3C trace context."""
    if TRACEPARENT not in extensions:
        return Context()
    try:
        return W3C.extract(extensions, Context())
    except Exception:  # the propagator does not raise on bad input; be sure
        return Context()


def valid_context(extensions: Mapping[str, str]) -> bool:
    """Whether ``extensions`` carry a valid trace context."""
    found = trace.get_current_span(context_of(extensions)).get_span_context()
    return found.is_valid


class OtelTracer:
    """:class:`~streamapp.tracing.api.Tracer` over one OpenTelemetry TracerProvider."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("streamapp", streamapp_version())

    def task(self, name: str) -> OtelTaskTrace:
        return OtelTaskTrace(self.tracer, name)

    def stamp(self, event: Event, name: str) -> Event:
        try:
            if valid_context(event.extensions):
                return event
            carrier: dict[str, str] = {}
            W3C.inject(carrier)
            if not carrier:  # no span is current: this send starts a trace
                span = self.tracer.start_span(name, Context(), kind=SpanKind.PRODUCER)
                W3C.inject(carrier, trace.set_span_in_context(span))
                span.end()
            return with_context(event, carrier)
        except Exception as exc:
            _failed("stamping an event", exc)
            return event

    @contextmanager
    def append(self, events: int, system: str) -> Iterator[AppendTrace]:
        attributes: dict[str, str | int] = {"db.system.name": system, "streamapp.events": events}
        with self.tracer.start_as_current_span(
            "append", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield _Append(span)

    def forwarded(
        self, events: Sequence[tuple[Event, int]], topics: Sequence[str], started_ns: int
    ) -> None:
        try:
            now = time.time_ns()
            names = list(topics)
            for event, position in events:
                span = self.tracer.start_span(
                    "forward",
                    context_of(event.extensions),
                    kind=SpanKind.PRODUCER,
                    attributes={
                        "streamapp.position": position,
                        "streamapp.topics": names,
                        "cloudevents.event_id": event.id,
                        "cloudevents.event_type": event.type,
                    },
                    start_time=started_ns,
                )
                span.end(end_time=now)
        except Exception as exc:
            _failed("the forwarder's spans", exc)

    @contextmanager
    def serve(
        self, name: str, headers: Mapping[str, str], attributes: Mapping[str, str | int]
    ) -> Iterator[_Answer]:
        try:
            parent = propagate.extract(headers, Context())
        except Exception:
            parent = Context()
        with self.tracer.start_as_current_span(
            name, parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield _Answer(span)

    @contextmanager
    def ask(
        self, name: str, headers: MutableMapping[str, str], attributes: Mapping[str, str | int]
    ) -> Iterator[_Answer]:
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                propagate.inject(headers)
            except Exception as exc:
                _failed("the context of a request", exc)
            yield _Answer(span)


def with_context(event: Event, carrier: Mapping[str, str]) -> Event:
    """``event`` with the trace context of ``carrier`` in place of its own."""
    extensions = {k: v for k, v in event.extensions.items() if k not in TRACE_CONTEXT}
    extensions.update(carrier)
    return dataclasses.replace(event, extensions=extensions)


class OtelTaskTrace:
    """:class:`~streamapp.tracing.api.TaskTrace`: what its lanes handled since the last
    commit, for the commit's span."""

    def __init__(self, tracer: trace.Tracer, name: str) -> None:
        self.tracer, self.name = tracer, name
        self.handled: list[tuple[SpanContext, str, int]] = []
        """The span, topic and partition of every delivery handled since the last commit."""

    def lane(self, agent: str) -> OtelLaneTrace:
        return OtelLaneTrace(self, agent)

    @contextmanager
    def committing(self, settle_at: int | None) -> Iterator[None]:
        handled, self.handled = self.handled, []
        if not handled:
            yield
            return
        first, topic, partition = handled[0]
        attributes: dict[str, Any] = {
            "streamapp.task": self.name,
            "streamapp.topic": topic,
            "streamapp.partition": partition,
            "streamapp.events": len(handled),
        }
        if settle_at is not None:
            attributes["streamapp.settle_at"] = settle_at
        with self.tracer.start_as_current_span(
            f"commit {topic}",
            trace.set_span_in_context(NonRecordingSpan(first), Context()),
            attributes=attributes,
            links=[Link(c) for c, _, _ in handled[1 : MAX_LINKS + 1]],
        ):
            yield


class OtelLaneTrace:
    """:class:`~streamapp.tracing.api.LaneTrace` of one agent in one partition task."""

    __slots__ = ("_span", "_token", "agent", "name", "task")

    def __init__(self, task: OtelTaskTrace, agent: str) -> None:
        self.task, self.agent, self.name = task, agent, f"handle {agent}"
        self._span: Span | None = None
        self._token: Token[Context] | None = None

    def start(self, record: Delivery, item: Event | DecodeError, attempt: int) -> None:
        try:
            if self._span is not None:
                self.abandon()
            attributes: dict[str, Any] = {
                "streamapp.agent": self.agent,
                "streamapp.topic": record.topic,
                "streamapp.partition": record.partition,
                "streamapp.position": record.position,
                "streamapp.attempts": attempt,
            }
            if isinstance(item, Event):
                parent = context_of(item.extensions)
                attributes["cloudevents.event_id"] = item.id
                attributes["cloudevents.event_type"] = item.type
            else:
                parent = Context()
            span = self.task.tracer.start_span(
                self.name, parent, kind=SpanKind.CONSUMER, attributes=attributes
            )
            self._token = otel_context.attach(trace.set_span_in_context(span))
            self._span = span
            self.task.handled.append((span.get_span_context(), record.topic, record.partition))
        except Exception as exc:
            _failed("a handler's span", exc)

    def end(self, result: Result, settled: bool) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        try:
            outcome = result.outcome.value
            span.set_attributes({"streamapp.outcome": outcome, "streamapp.settled": settled})
            if result.error is not None:
                span.record_exception(result.error)
            if outcome in FAILED:
                span.set_status(StatusCode.ERROR, result.reason)
            self._detach()
            span.end()
        except Exception as exc:
            _failed("a handler's span", exc)

    def abandon(self) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        try:
            span.set_status(StatusCode.ERROR, "the run stopped before the delivery's outcome")
            self._detach()
            span.end()
        except Exception as exc:
            _failed("a handler's span", exc)

    def committing(self, settle_at: int | None) -> AbstractContextManager[None]:
        return self.task.committing(settle_at)

    def _detach(self) -> None:
        """The span of :meth:`start` is no longer the current one."""
        token, self._token = self._token, None
        if token is not None:
            otel_context.detach(token)


class _Append:
    """:class:`~streamapp.tracing.api.AppendTrace` over the append's span."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.carrier: dict[str, str] = {}
        W3C.inject(self.carrier, trace.set_span_in_context(span))

    def stamp(self, event: Event) -> Event:
        if not self.carrier or valid_context(event.extensions):
            return event
        return with_context(event, self.carrier)

    def appended(self, events: int, skipped: int, error: str | None) -> None:
        self.span.set_attribute("streamapp.appended", events)
        self.span.set_attribute("streamapp.skipped", skipped)
        if error is not None:
            self.span.set_status(StatusCode.ERROR, error)


class _Answer:
    """:class:`~streamapp.tracing.api.Answer` over a request's span."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(StatusCode.ERROR, f"HTTP {status}")


_told: set[str] = set()


def _failed(what: str, exc: Exception) -> None:
    """Log a failure of OpenTelemetry's, once per kind: the work it traced goes on."""
    if what not in _told:
        _told.add(what)
        log.warning("tracing: %s failed (%r); the work goes on without it", what, exc)
