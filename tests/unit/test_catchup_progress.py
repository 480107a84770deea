"""Catch-up progress: a log line with events, rate and ETA; a bar on a terminal."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from streamapp import catchup
from streamapp.eventstore.base import StoredRow


class _Feed:
    def __init__(self, head: int) -> None:
        self.head = head
        self._waiting: dict[Any, Any] = {"task": object()}


def rows(start: int, n: int) -> list[StoredRow]:
    return [(p, "s", b"{}") for p in range(start, start + n)]


def test_progress_logs_events_rate_and_eta(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([0.0, 10.0, 20.0])
    monkeypatch.setattr(catchup.time, "monotonic", lambda: next(clock))
    progress = catchup._Progress()
    progress.bar = False
    with caplog.at_level(logging.INFO, logger="streamapp.catchup"):
        progress.tick(_Feed(head=4000), rows(1, 1000))  # t=10 s: 1000 events, 100 ev/s
    (line,) = [r.getMessage() for r in caplog.records]
    assert "1000 events replayed" in line
    assert "store position 1000 of 4000" in line
    assert "100 ev/s" in line
    assert "ETA 30s" in line


def test_progress_draws_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(catchup.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    monkeypatch.setattr(catchup.sys, "stderr", out)
    progress = catchup._Progress()
    progress.bar = True
    progress.tick(_Feed(head=2000), rows(1, 1000))
    assert "catching up [" + "#" * 15 + "." * 15 + "] 1000/2000" in out.getvalue()
    progress.done()
    assert out.getvalue().endswith("\n")
