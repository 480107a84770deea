"""The event-loop stall watchdog: who blocked the loop, on which record, for how long.

A handler that blocks the event loop (CPU work, ``time.sleep``, a blocking client) stalls
every partition of the worker, the group's heartbeats and the views. The loop stamps a
heartbeat every ``tick_s``; a daemon thread looks at it as often, and when the loop has
not run for longer than the bound it logs a WARNING while the stall still lasts, naming
what the loop runs: the agent and the record (from :data:`DOING`, the delivery each batch
task hands its handler) and the line it is blocked on. When the loop runs again its
first tick logs the total once and reports it (:class:`StallReport`: a metric, the last
stall in ``/status``). The hot path pays one dict write per delivery (:func:`doing`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import DecodeError
from ..events import Event
from ..records import Delivery

log = logging.getLogger("streamapp.stall")

DOING: dict[asyncio.Task[Any], tuple[str, Delivery, Event | DecodeError]] = {}
"""Per batch task: the agent and the delivery its handler is running now (set by
:func:`~streamapp.engine.run.run_lanes` before each handler call, removed after the
batch). The watchdog looks up the loop's current task in it."""


@dataclass(frozen=True, slots=True)
class Stall:
    """One stall of the event loop."""

    seconds: float
    """How long the loop did not run (so far, while it lasts)."""
    agent: str | None
    """The agent whose handler ran when the loop stopped (None: no handler ran)."""
    record: str
    """``topic[partition]@position``, stream id and type; or the task that ran."""
    where: str
    """The innermost line the loop's thread was blocked on (``file:line in function``)."""
    ended_at: float | None = None
    """Wall-clock time it ended (None: it still lasts)."""

    def describe(self) -> str:
        who = f"agent {self.agent!r} handling {self.record}" if self.agent else self.record
        return f"{who}, at {self.where}"

    def as_status(self) -> dict[str, object]:
        return {
            "seconds": round(self.seconds, 3),
            "agent": self.agent,
            "record": self.record,
            "where": self.where,
            "ended_at": self.ended_at,
        }


class StallReport(Protocol):
    """Where a stall goes once it ended (the worker's metrics)."""

    def stalled(self, stall: Stall) -> None: ...


class StallWatch:
    """Watches one event loop; start it on that loop, stop it before the loop closes."""

    def __init__(
        self, warn_s: float, report: StallReport | None = None, *, tick_s: float | None = None
    ) -> None:
        if warn_s <= 0:
            raise ValueError("a stall watch needs a positive bound")
        self.warn_s = warn_s
        self.tick_s = tick_s if tick_s is not None else min(max(warn_s / 5, 0.01), 0.1)
        self.report = report
        self.stalls = 0
        self.last: Stall | None = None
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._warned: tuple[float, Stall] | None = None
        """The beat a stall started after, and what the thread saw then."""

    def start(self) -> None:
        """Start stamping on the running loop and watching from a daemon thread."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopped.clear()
        self._beat = time.monotonic()
        self._timer = self._loop.call_later(self.tick_s, self._tick)
        self._thread = threading.Thread(target=self._watch, name="streamapp-stall", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    # on the loop --------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        blocked = now - self._beat - self.tick_s
        if blocked > self.warn_s:
            self._ended(blocked)
        self._beat = now
        assert self._loop is not None
        self._timer = self._loop.call_later(self.tick_s, self._tick)

    def _ended(self, blocked: float) -> None:
        warned = self._warned
        self._warned = None
        if warned is not None and warned[0] == self._beat:
            seen = warned[1]
        else:  # the thread did not see it (it could not run meanwhile): what ran is gone
            seen = Stall(blocked, None, "unknown (the watchdog could not look)", "unknown")
        stall = Stall(blocked, seen.agent, seen.record, seen.where, ended_at=time.time())
        self.stalls += 1
        self.last = stall
        log.warning(
            "event loop was blocked for %.2fs by %s: every partition, the group heartbeats "
            "and the views waited (setting loop_stall_warn_ms = %d). Run blocking or "
            "CPU-heavy handlers with @app.agent(..., blocking=True) "
            "(docs/concepts.md: Blocking handlers)",
            blocked,
            stall.describe(),
            round(self.warn_s * 1000),
        )
        if self.report is not None:
            self.report.stalled(stall)

    # on the watchdog thread -----------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped.wait(self.tick_s):
            beat = self._beat
            blocked = time.monotonic() - beat - self.tick_s
            if blocked <= self.warn_s:
                continue
            warned = self._warned
            if warned is not None and warned[0] == beat:
                continue  # warned once for this stall already
            stall = self._what(blocked)
            self._warned = (beat, stall)
            log.warning(
                "event loop blocked for %.2fs so far by %s: every partition, the group "
                "heartbeats and the views wait until it returns",
                blocked,
                stall.describe(),
            )

    def _what(self, blocked: float) -> Stall:
        """What the loop runs now: the current task's delivery and the innermost line."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        frame = sys._current_frames().get(self._loop_thread)
        where = "unknown"
        if frame is not None:
            code = frame.f_code
            where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
        doing = DOING.get(task) if task is not None else None
        if doing is None:
            name = task.get_name() if task is not None else "a callback"
            return Stall(blocked, None, f"no handler (task {name!r})", where)
        agent, record, item = doing
        return Stall(blocked, agent, describe(record, item), where)


def describe(record: Delivery, item: Event | DecodeError) -> str:
    """``topic[partition]@position`` with the event's stream id, type and id."""
    at = f"{record.topic}[{record.partition}]@{record.position}"
    if isinstance(item, DecodeError):
        return f"{at} (not decodable: {item.reason})"
    version = item.extensions.get("streamversion")
    sv = "" if version is None else f" version {version},"
    return f"{at} (stream {item.stream_id},{sv} type {item.type}, id {item.id})"


_ASYNCIO = os.path.dirname(asyncio.__file__)


def awaiting(task: asyncio.Future[Any]) -> str:
    """The innermost line of ``task``'s own code it waits on (``file:line in function``),
    following what each of its coroutines awaits (asyncio's own frames skipped)."""
    where = "unknown"
    awaited: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    for _ in range(50):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        if not code.co_filename.startswith(_ASYNCIO):
            where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return where


def watch_loop(warn_ms: int, report: StallReport | None) -> Callable[[], None]:
    """Start a :class:`StallWatch` on the running loop (``warn_ms`` 0: none); returns
    what stops it."""
    if warn_ms <= 0:
        return lambda: None
    watch = StallWatch(warn_ms / 1000, report)
    watch.start()
    return watch.stop
