"""Logging set-up of a worker: lifecycle lines from streamapp, client noise throttled.

During a broker outage aiokafka logs every failed connect, fetch and metadata request at
ERROR (hundreds of lines a second). :class:`Throttle` lets the first record of each
message through and then one per ``window_s``, saying how many it held back.
:class:`Gate` does the same for handler tracebacks (first per partition, then one a
window). Setting ``log_format`` = ``json`` (``STREAMAPP_LOG_FORMAT``) writes one JSON
object per line instead of text. The engine's own summary lines are in
:mod:`streamapp.engine.summary` and :mod:`streamapp.engine.resume`.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    pass

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Gate:
    """True for a key's first call, then at most once per ``window_s``."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._last: dict[object, float] = {}

    def due(self, key: object) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[key] = now
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            body["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            body["stack"] = record.stack_info
        return orjson.dumps(body).decode()


class Throttle(logging.Filter):
    """Pass a message's first record, then at most one per ``window_s`` with a count."""

    def __init__(self, window_s: float = 30.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._seen: dict[tuple[str, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        last, held = self._seen.get(key, (-self.window_s, 0))
        if now - last < self.window_s:
            self._seen[key] = (last, held + 1)
            return False
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} similar held back in {self.window_s:.0f}s)"
        return True


def configure(level: str, fmt: str = "text") -> None:
    """Log lines (text or JSON) to stderr; aiokafka at WARNING and throttled."""
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    stream.addFilter(_only("aiokafka", Throttle()))
    logging.basicConfig(level=level.upper(), handlers=[stream], force=True)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def _only(prefix: str, throttle: Throttle) -> logging.Filter:
    class _Scoped(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.name.startswith(prefix) or throttle.filter(record)

    return _Scoped()
