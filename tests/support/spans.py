"""Tracing on for one test: the OpenTelemetry SDK with its in-memory exporter.

:func:`recording` turns streamapp's tracing on with a provider of its own (never the
process's global one, which can be set once) and off again after the test; the parts
made meanwhile (a worker, a memory broker, a store) trace into it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamapp import tracing


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Tracing on into an in-memory exporter (each span there once it ends)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def of_event(spans: list[ReadableSpan], event_id: str) -> list[ReadableSpan]:
    """The spans of ``spans`` about the event of id ``event_id``."""
    return [s for s in spans if (s.attributes or {}).get("cloudevents.event_id") == event_id]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent of ``span``."""
    context = span.context
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_id(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent (None: a root span)."""
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id
