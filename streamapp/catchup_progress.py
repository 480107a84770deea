"""Catch-up progress: events applied, events left, rate and ETA, and where it is stuck.

Counted by events applied, never by rows read: a chunk read again (a partition trying a
failed event again) counts once, and the count grows while a chunk is applied (the share
in hand says how far its iteration got), so a store smaller than one read chunk still
shows progress. Events left: what the chunk in hand still holds for the catching-up
partitions, plus the positions not read yet times the part of the rows read that those
partitions apply (each applies only its streams; under Kafka a worker owns some
partitions). Rate is applied events over the time since the catch-up began; ETA is left
over rate. A partition stuck on an event that fails under Redeliver is named, with its
attempts and last error, instead of an ETA that would never come.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .codecs.structured import from_stored
from .eventstore.base import StoredRow

if TYPE_CHECKING:
    from .engine.replay import Replayed

log = logging.getLogger("streamapp.catchup")


class ShareInHand(Protocol):
    """A partition's share of a chunk in hand (:class:`streamapp.catchup.Share`), as far
    as progress reads it (a protocol: catch-up imports this module, not the reverse)."""

    def taken(self) -> int:
        """How many of its deliveries were handed out so far."""
        ...


EVERY_S = 5.0
"""How often a progress line is logged (a terminal's bar is redrawn every 0.5 s)."""


@dataclass(frozen=True, slots=True)
class StuckEvent:
    """The stored event a catching-up partition fails on, again and again (Redeliver)."""

    partition: str
    position: int
    """Its event-store position."""
    stream_id: str
    version: int | None
    type: str
    attempts: int
    """Failed attempts so far."""
    last_error: str

    def describe(self) -> str:
        return (
            f"{self.partition} is stuck on store position {self.position} (stream "
            f"{self.stream_id!r} version {self.version}, type {self.type!r}) after "
            f"{self.attempts} failed attempts; last error: {self.last_error}. Fix the "
            "handler (it is tried again), or give the agent on_failure=Park(...)"
        )

    def as_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "message": self.describe()}


def stuck_record(task: Replayed, rows: list[StoredRow]) -> StuckEvent | None:
    """What ``task`` is stuck on, from the rows of the chunk it failed in (None: the
    failing row is not among them, or no lane counts a failed attempt at it)."""
    failing = task.failing()  # at or after its store position
    if not failing:
        return None
    attempts = min(failing, key=lambda a: a.position or 0)
    position = attempts.position
    row = next((r for r in rows if r[0] == position), None)
    if row is None or position is None:
        return None
    try:
        event = from_stored(row[2])
        kind, version = event.type, event.stream_version
    except Exception:  # not decodable: the failure itself says why
        kind, version = "?", None
    return StuckEvent(
        task.name, position, row[1], version, kind, attempts.failed, attempts.last_error
    )


@dataclass(slots=True)
class _Count:
    """One partition's counts in a catch-up."""

    base: int
    """Its ``replayed`` when it began."""
    left: int = 0
    """Events of the chunk in hand for it, not applied when that chunk began."""
    at_chunk: int = 0
    """Its applied count when that chunk began."""
    end: int = 1
    """The first store position it has not been given yet."""
    ratio: float = 1.0
    """Its events per store position in the rows read."""


class CatchUpProgress:
    """One worker's catch-up counts (a catch-up begins when a partition starts waiting
    for the store and ends when none waits)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.bar = sys.stderr.isatty()
        self._drawn = False
        self.stuck: dict[Replayed, StuckEvent] = {}
        self._reset()

    def _reset(self) -> None:
        self.started: float | None = None
        self.head = 0
        self._counts: dict[Replayed, _Count] = {}
        """The partitions waiting for the store."""
        self._done = 0  # events applied by partitions of this catch-up that went live
        self._inflight: tuple[Replayed, ShareInHand, int] | None = None

    # what the feed tells ---------------------------------------------------------------
    def join(self, task: Replayed) -> None:
        if self.started is None:
            self.started = self._clock()
        if task not in self._counts:  # its share of each position: as the partitioner's
            self._counts[task] = _Count(task.replayed, ratio=1 / task.topic.partitions)

    def chunk(self, task: Replayed, rows: int, mine: int, left: int, end: int) -> None:
        """``task`` is given a chunk of ``rows`` rows, ``mine`` of them its own and
        ``left`` of those not applied yet; the next read starts at ``end``."""
        count = self._counts.get(task)
        if count is None:
            return  # following the store, not catching up
        count.left, count.at_chunk = left, self._applied(task, count)
        count.end = max(count.end, end)
        if rows:
            count.ratio = mine / rows

    def applying(self, task: Replayed, share: ShareInHand) -> None:
        self._inflight = (task, share, task.replayed)

    def applied_share(self) -> None:
        self._inflight = None

    def finish(self, waiting: Iterable[Replayed]) -> None:
        """Partitions that are caught up leave; with none waiting, the catch-up ends."""
        still = set(waiting)
        for task in [t for t in self.stuck if t not in still]:
            del self.stuck[task]
            task.stuck(None)
        for task in [t for t in self._counts if t not in still]:
            self._done += self._applied(task, self._counts.pop(task))
        if not still and self.started is not None:
            self.report(done=True)
            self._reset()

    # what it shows ---------------------------------------------------------------------
    def _applied(self, task: Replayed, count: _Count) -> int:
        done = task.replayed - count.base
        if self._inflight is not None and self._inflight[0] is task:
            _, share, before = self._inflight
            done += max(0, share.taken() - 1 - (task.replayed - before))
        return done

    def _left(self, task: Replayed, count: _Count) -> int:
        in_chunk = max(0, count.left - (self._applied(task, count) - count.at_chunk))
        return in_chunk + round(max(0, self.head - count.end + 1) * count.ratio)

    def applied(self) -> int:
        """Events applied so far in this catch-up (committed, plus the share in hand)."""
        return self._done + sum(self._applied(t, c) for t, c in self._counts.items())

    def left(self) -> int:
        """Events still to apply (estimated past the rows read)."""
        return sum(self._left(t, c) for t, c in self._counts.items())

    def status(self) -> dict[str, object]:
        if self.started is None:
            return {"active": False, "stuck": [s.as_dict() for s in self.stuck.values()]}
        elapsed = self._clock() - self.started
        applied, left = self.applied(), self.left()
        rate = applied / elapsed if elapsed > 0 else 0.0
        return {
            "active": True,
            "applied": applied,
            "left": left,
            "total": applied + left,
            "head": self.head,
            "elapsed_s": round(elapsed, 1),
            "rate": round(rate, 1),
            "eta_s": round(left / rate, 1) if rate and not self._all_stuck() else None,
            "stuck": [s.as_dict() for s in self.stuck.values()],
        }

    def _all_stuck(self) -> bool:
        return bool(self.stuck) and all(t in self.stuck for t in self._counts)

    def report(self, *, done: bool = False) -> None:
        """A progress line (or the bar redrawn); ``done``: the closing line."""
        if self.started is None:
            return
        elapsed = self._clock() - self.started
        applied, left = self.applied(), self.left()
        rate = applied / elapsed if elapsed > 0 else 0.0
        if done:
            self._end_bar()
            log.info("caught up: %d events applied in %.1fs (%.0f ev/s)", applied, elapsed, rate)
            return
        if self.stuck and self._all_stuck():
            eta = "stuck"
        else:
            eta = f"ETA {left / rate:.0f}s" if rate else "ETA unknown"
        if self.bar:
            total = applied + left
            filled = int(30 * applied / total) if total else 30
            sys.stderr.write(
                f"\rcatching up [{'#' * filled}{'.' * (30 - filled)}] "
                f"{applied}/{total} events {rate:,.0f} ev/s {eta} "
            )
            sys.stderr.flush()
            self._drawn = True
        else:
            log.info(
                "catching up: %d of %d events applied (store head %d), %.0f ev/s, %s",
                applied,
                applied + left,
                self.head,
                rate,
                eta,
            )
        for record in self.stuck.values():
            log.warning("catching up: %s", record.describe())

    def _end_bar(self) -> None:
        if self._drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._drawn = False

    def close(self) -> None:
        self._end_bar()
