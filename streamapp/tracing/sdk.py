"""An OpenTelemetry SDK TracerProvider made from the standard ``OTEL_*`` variables.

What the SDK reads itself, it reads: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
(the resource), ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (the sampler),
``OTEL_BSP_*`` (the batch span processor), ``OTEL_SPAN_*_LIMIT``, and each exporter its
own (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._HEADERS``, ...). What only the SDK's
auto-configuration (``opentelemetry-instrument``, a private module) would read is read
here the same way: ``OTEL_TRACES_EXPORTER``, a comma list of the exporters installed
under the entry point group ``opentelemetry_traces_exporter`` (``console`` is the SDK's;
``otlp`` is OTLP over HTTP/protobuf, the ``otel`` extra's exporter, unless
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``grpc``).
Each exporter gets a batch span processor: spans leave on the SDK's thread, never on the
event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

GROUP = "opentelemetry_traces_exporter"
PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http (in streamapp's otel extra)",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "zipkin_json": "opentelemetry-exporter-zipkin-json",
}


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, ``none`` left out (the variable unset:
    ``otlp`` when an OTLP endpoint is set, else none)."""
    raw = environ.get("OTEL_TRACES_EXPORTER")
    if raw is None:
        endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        raw = "otlp" if any(environ.get(name) for name in endpoints) else ""
    names = [name.strip().lower() for name in raw.split(",")]
    return list(dict.fromkeys(name for name in names if name and name != "none"))


def provider_from_env(
    environ: Mapping[str, str], service: str | None
) -> tuple[TracerProvider | None, str]:
    """A TracerProvider exporting to every exporter of :func:`exporter_names` through a
    batch span processor, or None and why not (an exporter named is not installed: the
    reason names the package that has it); ``service`` is the ``service.name`` when
    neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one."""
    exporters = []
    for name in exporter_names(environ):
        exporter = _exporter(name, environ)
        if isinstance(exporter, str):
            return None, exporter
        exporters.append(exporter)
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named or service is None else {"service.name": service})
    provider = TracerProvider(resource=resource)
    for made in exporters:
        provider.add_span_processor(BatchSpanProcessor(made))
    return provider, ""


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter | str:
    """The exporter ``name`` of ``OTEL_TRACES_EXPORTER``, made; or why it cannot be."""
    entry = name
    if name == "otlp":
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        entry = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
    found = list(entry_points(group=GROUP, name=entry))
    if not found:
        package = PACKAGES.get(entry, f"the package that gives entry point {entry!r} of {GROUP}")
        return (
            f"OTEL_TRACES_EXPORTER names {name!r}, and no exporter {entry!r} is installed: "
            f"install {package}, or name another exporter (console, otlp)"
        )
    made: SpanExporter = found[0].load()()
    return made
