"""The trace context of an event on the wire (the CloudEvents distributed-tracing
extension: ``traceparent``, ``tracestate``) and the decision whether tracing is on.

Binary mode carries it as ``ce_traceparent`` and ``ce_tracestate`` headers, structured
mode as JSON attributes, AMQP as ``cloudEvents_`` headers; a trace context that cannot
be read is dropped, never the event's failure. Tracing is off unless an ``OTEL_*``
variable asks for it, and without the OpenTelemetry packages it stays off (simulated
by the module's own loader, and for real in a process where they cannot be imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from streamapp import Event, tracing
from streamapp.codecs import amqp, structured
from streamapp.codecs import kafka as codec
from streamapp.errors import DecodeError

ROOT = Path(__file__).resolve().parents[2]
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def _traced(**more: str) -> Event:
    return Event.create(
        "order.placed",
        stream_id="o-1",
        data={"n": 1},
        extensions={"traceparent": PARENT, "tracestate": STATE, **more},
    )


def test_binary_mode_carries_the_context_as_ce_headers() -> None:
    key, value, headers = codec.encode(_traced())
    assert ("ce_traceparent", PARENT.encode()) in headers
    assert ("ce_tracestate", STATE.encode()) in headers
    back = codec.decode(key, value, headers)
    assert back.extensions["traceparent"] == PARENT
    assert back.extensions["tracestate"] == STATE


def test_structured_mode_carries_the_context_as_attributes() -> None:
    key, value, headers = codec.encode_structured(_traced())
    body = orjson.loads(value)
    assert body["traceparent"] == PARENT
    assert body["tracestate"] == STATE
    back = codec.decode(key, value, headers)
    assert (back.extensions["traceparent"], back.extensions["tracestate"]) == (PARENT, STATE)


def test_amqp_carries_the_context_as_cloudevents_headers() -> None:
    _, body, headers = amqp.encode(_traced())
    assert ("cloudEvents_traceparent", PARENT.encode()) in headers
    assert ("cloudEvents_tracestate", STATE.encode()) in headers
    back = amqp.decode(body, headers)
    assert (back.extensions["traceparent"], back.extensions["tracestate"]) == (PARENT, STATE)
    colon = [(n.replace("cloudEvents_", "cloudEvents:"), v) for n, v in headers]
    assert amqp.decode(body, colon).extensions["traceparent"] == PARENT


def test_an_event_without_a_context_has_no_trace_headers() -> None:
    event = Event.create("order.placed", stream_id="o-1", data={})
    _, _, headers = codec.encode(event)
    assert not [n for n, _ in headers if "trace" in n]
    assert "traceparent" not in codec.decode(*codec.encode(event)).extensions


def test_a_context_that_is_not_valid_w3c_still_decodes_as_it_is() -> None:
    """The codec carries the extension's text; whether it is valid trace context is the
    tracer's to judge (it ignores it: tests/unit/test_tracing.py)."""
    event = _traced(traceparent="not-a-traceparent")
    assert codec.decode(*codec.encode(event)).extensions["traceparent"] == "not-a-traceparent"


@pytest.mark.parametrize("bad", [b"\xff\xfe", None])
def test_an_unreadable_trace_header_is_dropped_not_the_event(bad: bytes | None) -> None:
    key, value, headers = codec.encode(_traced())
    for name in ("ce_traceparent", "ce_tracestate", "CE_TRACEPARENT"):
        broken = [(n, v) for n, v in headers if n.lower() != name.lower()] + [(name, bad)]
        back = codec.decode(key, value, broken)  # type: ignore[arg-type]
        assert back.id
        assert back.data == {"n": 1}
        assert name.lower()[3:] not in back.extensions
    _, body, amqp_headers = amqp.encode(_traced())
    broken = [(n, v) for n, v in amqp_headers if n != "cloudEvents_traceparent"]
    back = amqp.decode(body, [*broken, ("cloudEvents_traceparent", bad)])  # type: ignore[list-item]
    assert "traceparent" not in back.extensions
    assert back.extensions["tracestate"] == STATE


def test_an_unreadable_header_that_is_not_the_trace_context_still_fails() -> None:
    key, value, headers = codec.encode(_traced())
    broken = [*headers, ("ce_traceparent", b"\xff"), ("ce_source", b"\xff")]
    broken = [(n, v) for n, v in broken if (n, v) != ("ce_source", b"streamapp")]
    with pytest.raises(DecodeError, match="ce_source"):
        codec.decode(key, value, broken)


def test_a_structured_trace_context_that_is_not_text_is_dropped() -> None:
    body = orjson.loads(structured.to_json(_traced()))
    body["traceparent"] = None
    body["tracestate"] = {"not": "text"}
    back = structured.from_json(orjson.dumps(body))
    assert back.id
    assert not ({"traceparent", "tracestate"} & set(back.extensions))
    body["other"] = None
    with pytest.raises(DecodeError, match="'other'"):
        structured.from_json(orjson.dumps(body))


# the decision ---------------------------------------------------------------------------
def test_opentelemetry_is_the_otel_extra_and_pinned_for_dev() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("opentelemetry") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    for extra in ("otel", "dev"):
        names = {d.split(">")[0] for d in extras[extra]}
        assert {"opentelemetry-api", "opentelemetry-sdk"} <= names, extra
    pinned = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("opentelemetry-sdk==") for line in pinned)  # CI's dev set


def test_every_module_but_the_spans_imports_without_opentelemetry() -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        "sys.modules['opentelemetry'] = None  # any import of it raises ImportError\n"
        "import streamapp\n"
        "for m in pkgutil.walk_packages(streamapp.__path__, 'streamapp.'):\n"
        "    if m.name not in ('streamapp.__main__', 'streamapp.tracing.otel',\n"
        "                      'streamapp.tracing.sdk'):\n"
        "        importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def _missing(name: str) -> ModuleType:
    raise ImportError(f"No module named 'opentelemetry' (for {name})")


def test_off_unless_an_otel_variable_asks_for_it() -> None:
    assert tracing.decide({}).tracer is None
    assert tracing.decide({"OTEL_TRACES_EXPORTER": "none"}).tracer is None
    off = tracing.decide({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert off.tracer is None
    assert "OTEL_SDK_DISABLED" in off.why


def test_without_the_packages_an_asked_for_tracing_stays_off_and_says_how_to_install() -> None:
    for asked in ({"OTEL_TRACES_EXPORTER": "console"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}):
        decided = tracing.decide(asked, "app", load=_missing)
        assert decided.tracer is None
        assert decided.warn
        assert "not installed" in decided.why
        assert "pip install -e '.[otel]'" in decided.why


def test_an_exporter_that_is_not_installed_leaves_tracing_off_naming_it() -> None:
    decided = tracing.decide({"OTEL_TRACES_EXPORTER": "jaegerish"})
    assert decided.tracer is None
    assert decided.warn
    assert "'jaegerish'" in decided.why
    assert "console, otlp" in decided.why


def _run(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter (this checkout importable) with ``env`` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


APP_RUN = """
    import asyncio, json, sys
    from streamapp import App, Event, Table, TableView, tracing
    from streamapp.eventstore import Append, open_store
    from streamapp.testing import MemoryBroker

    app = App("t")
    seen: Table[int] = Table("seen")

    @app.agent(app.topic("in", partitions=2), tables=[seen])
    async def count(event: Event, view: TableView[int]) -> None:
        assert event.stream_id is not None
        view[event.stream_id] = view.get(event.stream_id, 0) + 1

    async def main() -> None:
        broker = MemoryBroker(app)
        for i in range(5):
            broker.send("in", Event.create("e", stream_id=f"s{i}", data={}))
        await broker.process()
        store = await open_store(f"sqlite:///{sys.argv[1]}/events.db?create=1")
        try:
            result = await store.append_many([Append("s", [Event.create("e", stream_id="s")])])
            assert result.error is None
        finally:
            await store.close()
        imported = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v]
        print("RESULT " + json.dumps({
            "counted": sum(broker.table("seen").get(f"s{i}", 0) for i in range(5)),
            "active": tracing.active() is not None,
            "why": tracing.start(),
            "imported": sorted(imported),
        }), flush=True)

    asyncio.run(main())
"""


def _result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    out: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return out


def test_without_the_packages_streamapp_imports_and_runs_with_tracing_off(tmp_path: Path) -> None:
    """An install without the otel extra: OpenTelemetry cannot be imported at all (the
    interpreter refuses it), yet with tracing asked for the app runs on the memory
    broker and appends to a store, tracing off, the reason saying what to install."""
    blocked = "import sys; sys.modules['opentelemetry'] = None\n"
    run = f"import sys; sys.argv.append({str(tmp_path)!r})\n" + blocked + textwrap.dedent(APP_RUN)
    out = _result(_run(run, OTEL_TRACES_EXPORTER="console"))
    assert out["counted"] == 5
    assert out["active"] is False
    assert "not installed" in out["why"]
    assert out["imported"] == []


def test_tracing_not_configured_never_imports_opentelemetry(tmp_path: Path) -> None:
    run = f"import sys; sys.argv.append({str(tmp_path)!r})\n" + textwrap.dedent(APP_RUN)
    out = _result(_run(run))
    assert out["counted"] == 5
    assert out["active"] is False
    assert out["imported"] == []


def test_the_otel_variables_turn_it_on_with_the_sdks_own_exporter(tmp_path: Path) -> None:
    """``OTEL_TRACES_EXPORTER=console`` and ``OTEL_SERVICE_NAME``: the SDK's console
    exporter prints each span, with the service name and streamapp's span names."""
    run = f"import sys; sys.argv.append({str(tmp_path)!r})\n" + textwrap.dedent(APP_RUN)
    done = _run(run, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="orders-projection")
    last = _result(done)
    assert '"name": "handle count"' in done.stdout
    assert '"name": "commit in"' in done.stdout
    assert '"name": "append"' in done.stdout
    assert '"service.name": "orders-projection"' in done.stdout
    assert last["active"] is True
    assert "OTEL_TRACES_EXPORTER=console" in last["why"]
