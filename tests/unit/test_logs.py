"""Logging: the client-noise throttle, handler tracebacks per partition, JSON lines."""

from __future__ import annotations

import logging
import sys
import uuid

import orjson
import pytest

from streamapp import App, ConfigError, Event, Settings, logs
from streamapp.logs import Gate, JsonFormatter, Throttle
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.topics import partition_for


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("aiokafka", logging.ERROR, __file__, 1, msg, None, None)


def test_repeats_are_held_back_then_counted() -> None:
    throttle = Throttle(window_s=0.2)
    assert throttle.filter(_record("Unable connect to %s"))
    assert not throttle.filter(_record("Unable connect to %s"))
    assert not throttle.filter(_record("Unable connect to %s"))
    assert throttle.filter(_record("another message"))  # keyed by message
    throttle.window_s = 0.0  # the window has passed
    again = _record("Unable connect to %s")
    assert throttle.filter(again)
    assert "(2 similar held back" in again.getMessage()


def test_gate_first_then_once_per_window() -> None:
    gate = Gate(window_s=60.0)
    assert gate.due(("a", "t", 0))
    assert not gate.due(("a", "t", 0))
    assert gate.due(("a", "t", 1))  # per partition
    gate.window_s = 0.0
    assert gate.due(("a", "t", 0))


def test_json_lines_carry_the_traceback() -> None:
    try:
        raise ValueError("bad value 7")
    except ValueError:
        record = logging.LogRecord(
            "streamapp.agents.agent",
            logging.WARNING,
            __file__,
            1,
            "failed %s",
            ("x",),
            sys.exc_info(),
        )
    line = JsonFormatter().format(record)
    body = orjson.loads(line)
    assert "\n" not in line
    assert body["level"] == "WARNING"
    assert body["logger"] == "streamapp.agents.agent"
    assert body["message"] == "failed x"
    assert "ValueError: bad value 7" in body["traceback"]
    assert body["time"].endswith("+00:00")


def test_configure_json_switches_the_root_handler() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        logs.configure("info", "json")
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        logs.configure("debug", "text")
        (handler,) = root.handlers
        assert not isinstance(handler.formatter, JsonFormatter)
        assert root.level == logging.DEBUG
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def test_log_format_setting() -> None:
    assert Settings.from_env("a", env={"STREAMAPP_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(ConfigError, match="STREAMAPP_LOG_FORMAT"):
        Settings.from_env("a", env={"STREAMAPP_LOG_FORMAT": "xml"})


async def test_handler_traceback_first_time_per_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App(f"tb{uuid.uuid4().hex[:6]}")

    @app.agent(app.topic("in", partitions=2), name=f"failing_{uuid.uuid4().hex[:6]}")
    async def failing(event: Event) -> None:
        raise KeyError("missing-field-in-handler")

    broker = MemoryBroker(app, max_attempts=4)
    keys = {}
    i = 0
    while len(keys) < 2:  # one key per partition
        keys.setdefault(partition_for(f"k{i}".encode(), 2), f"k{i}")
        i += 1
    for key in keys.values():
        broker.send("in", Event.create("x", stream_id=key, data={}))
    caplog.set_level(logging.INFO, logger="streamapp.agent")
    with pytest.raises(StuckRecordsError):
        await broker.process()
    failures = [r for r in caplog.records if "will redeliver" in r.getMessage()]
    assert len(failures) == 8  # 4 attempts on each of 2 partitions, each one line
    with_tb = [r for r in failures if r.exc_info]
    assert len(with_tb) == 2
    assert {r.getMessage().split()[2].split("@")[0] for r in with_tb} == {"in[0]", "in[1]"}
    assert "missing-field-in-handler" in caplog.text
    assert 'raise KeyError("missing-field-in-handler")' in caplog.text
