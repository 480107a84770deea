"""The client-noise throttle: first record passes, repeats are held back and counted."""

from __future__ import annotations

import logging

from streamapp.logs import Throttle


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
