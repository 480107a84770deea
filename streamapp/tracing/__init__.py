"""OpenTelemetry tracing of streamapp: whether it is on, decided once per process.

Off unless configured, and then free: nothing here imports OpenTelemetry. The parts that
trace (partition tasks and their lanes, a handler's ``send``, event-store appends, the
forwarder, the views) ask :func:`active` once when they are made and keep None when
tracing is off, so a delivery costs one test of that attribute. Only
:mod:`streamapp.tracing.otel` and :mod:`streamapp.tracing.sdk` import OpenTelemetry (an
import-linter contract says so), and only once tracing is on.

On when, in this order (:func:`decide`; ``docs/tracing.md``):

1. ``OTEL_SDK_DISABLED=true``: off, whatever else is set;
2. the application already set an OpenTelemetry TracerProvider of its own (the SDK in its
   code, ``opentelemetry-instrument``): on, streamapp's spans go to it;
3. ``OTEL_TRACES_EXPORTER`` names an exporter (not ``none``), or an OTLP endpoint is set
   (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): on, with an
   SDK TracerProvider of the ``OTEL_*`` variables (:mod:`streamapp.tracing.sdk`), which
   also becomes the process's global one for the application's own spans;
4. otherwise off. Without the ``otel`` extra (``pip install -e '.[otel]'``) 2 cannot
   happen and 3 logs a warning and stays off.

Tests and the bench give a provider of their own with :func:`enable`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple

from .api import Answer, AppendTrace, LaneTrace, TaskTrace, Tracer

__all__ = [
    "Answer",
    "AppendTrace",
    "Decision",
    "LaneTrace",
    "TaskTrace",
    "Tracer",
    "active",
    "decide",
    "disable",
    "enable",
    "start",
]

log = logging.getLogger("streamapp.tracing")

Loader = Callable[[str], ModuleType]
"""Imports one of this package's OpenTelemetry modules by name (``importlib.import_module``;
a test gives one that raises ImportError, as an install without the extra does)."""


class Decision(NamedTuple):
    """Whether tracing is on (``tracer``), why, and whether the environment asked for it
    in vain (a warning: the packages or an exporter are missing)."""

    tracer: Tracer | None
    why: str
    warn: bool = False


class _Switch:
    """The process's one decision."""

    decided = False
    tracer: Tracer | None = None
    why = "not decided yet"


_switch = _Switch()


def active() -> Tracer | None:
    """The process's tracer, or None when tracing is off; decided at the first call
    (:func:`start`) and the same afterwards."""
    if not _switch.decided:
        start()
    return _switch.tracer


def start(service: str | None = None) -> str:
    """Decide, once, whether tracing is on (``service``: the ``service.name`` when the
    environment names none, e.g. the app id); what was decided, as a line for the log
    (later calls return the first decision's)."""
    if _switch.decided:
        return _switch.why
    tracer, why, warn = decide(os.environ, service)
    _switch.tracer, _switch.why, _switch.decided = tracer, why, True
    log.log(logging.WARNING if warn else logging.INFO if tracer else logging.DEBUG, "%s", why)
    return why


def decide(
    environ: Mapping[str, str], service: str | None = None, *, load: Loader | None = None
) -> Decision:
    """The tracer the ``OTEL_*`` variables of ``environ`` ask for (None: off) and why, by
    the rules of this module's docstring; ``load`` imports this package's OpenTelemetry
    modules (default ``importlib.import_module``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Decision(None, "tracing off: OTEL_SDK_DISABLED=true")
    load = load or importlib.import_module
    if "opentelemetry.trace" in sys.modules:  # the application imported OpenTelemetry
        try:
            otel: ModuleType | None = load(f"{__name__}.otel")
        except ImportError:
            otel = None  # the SDK's part missing: as if the application had none
        if otel is not None and otel.app_configured():
            tracer: Tracer = otel.OtelTracer(otel.trace.get_tracer_provider())
            return Decision(tracer, "tracing on: the application's OpenTelemetry TracerProvider")
    asked = environ.get("OTEL_TRACES_EXPORTER")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if asked is None and not endpoint:
        return Decision(None, "tracing off: no OTEL_TRACES_EXPORTER, no OTLP endpoint")
    if asked is not None and asked.strip().lower() in ("", "none"):
        return Decision(None, f"tracing off: OTEL_TRACES_EXPORTER={asked}")
    what = f"OTEL_TRACES_EXPORTER={asked}" if asked else f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}"
    try:
        otel, sdk = load(f"{__name__}.otel"), load(f"{__name__}.sdk")
    except ImportError as exc:
        return Decision(None, _missing(what, exc), warn=True)
    provider, why_not = sdk.provider_from_env(environ, service)
    if provider is None:
        return Decision(None, f"tracing off: {why_not}", warn=True)
    otel.trace.set_tracer_provider(provider)  # the application's own spans go there too
    names = ", ".join(sdk.exporter_names(environ))
    return Decision(otel.OtelTracer(provider), f"tracing on: {what}, exporting to {names}")


def _missing(what: str, exc: ImportError) -> str:
    return (
        f"tracing off: {what} asks for tracing, but the OpenTelemetry packages are not "
        f"installed ({exc}); "
        "install streamapp with its otel extra: pip install -e '.[otel]'"
    )


def enable(provider: Any = None) -> Tracer:
    """Tracing on with ``provider`` (an OpenTelemetry TracerProvider; None: the global
    one), whatever the environment says: for tests (an in-memory exporter) and the bench.
    Call it before making the worker or the app's parts: each asks once, when made."""
    otel = importlib.import_module(f"{__name__}.otel")
    tracer: Tracer = otel.OtelTracer(
        provider if provider is not None else otel.trace.get_tracer_provider()
    )
    _switch.tracer, _switch.why, _switch.decided = tracer, "tracing on: enable()", True
    return tracer


def disable() -> None:
    """Tracing off for the parts made from now on (a test's end)."""
    _switch.tracer, _switch.why, _switch.decided = None, "tracing off: disable()", True
