"""Logging set-up of a worker: lifecycle lines from streamapp, client noise throttled.

During a broker outage aiokafka logs every failed connect, fetch and metadata request at
ERROR (hundreds of lines a second). :class:`Throttle` lets the first record of each
message through and then one per ``window_s``, saying how many it held back.
"""

from __future__ import annotations

import logging
import sys
import time


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


def configure(level: str) -> None:
    """Log lines to stderr; aiokafka at WARNING and throttled."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    client = logging.getLogger("aiokafka")
    client.setLevel(logging.WARNING)
    throttle = Throttle()
    for handler in logging.getLogger().handlers:
        handler.addFilter(_only("aiokafka", throttle))


def _only(prefix: str, throttle: Throttle) -> logging.Filter:
    class _Scoped(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.name.startswith(prefix) or throttle.filter(record)

    return _Scoped()
