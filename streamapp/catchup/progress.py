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

from ..codecs.structured import from_stored
from ..eventstore.base import StoredRow

if TYPE_CHECKING:
    from ..engine.task_surface import Replayed

log = logging.getLogger("streamapp.catchup")


class ShareInHand(Protocol):
    """A partition's share of a chunk in hand (:class:`streamapp.engine.stored.Share`), as far
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
    version: int | None = row[2]
    try:
        kind = from_stored(row[3]).type
    except Exception:  # not decodable: the failure itself says why
        kind = "?"
    return StuckEvent(
        task.name, position, row[1], version, kind, attempts.failed, attempts.last_error
    )


@dataclass(slots=True)
class _Count:
    """One member's counts in a catch-up (a partition, or lanes building beside live
    ones): what it applied and where it stands, each shown never to go back."""

    name: str
    base: int
    """Its ``replayed`` when it joined."""
    first: int
    """Its store position when it joined (the next position it needed)."""
    end: int
    """The first store position it has not been given yet."""
    ratio: float
    """Its events per store position in the rows it was given (its partition's share)."""
    left: int = 0
    """Events of the chunk in hand for it, not applied when that chunk began."""
    at_chunk: int = 0
    """Its applied count when that chunk began."""
    rows: int = 0
    mine: int = 0
    """Rows it was given so far, and how many of them were its own."""
    shown: int = 0
    """The most it was shown to have applied."""
    position: int = 0
    """The last store position it was shown to have reached."""


class CatchUpProgress:
    """One worker's catch-up counts, per member (a catch-up begins when a member starts
    waiting for the store and ends when none waits). Every figure a member shows only
    grows, and none passes the store's head: its events left are at most the positions
    left, its position at most the head."""

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
        """The members waiting for the store."""
        self._done = 0  # events applied by members of this catch-up that left
        self._stopped: list[str] = []
        """Where the members that stopped before their end were (closed, fenced)."""
        self._inflight: dict[Replayed, tuple[ShareInHand, int]] = {}

    # what the feed tells ---------------------------------------------------------------
    def join(self, task: Replayed) -> None:
        if self.started is None:
            self.started = self._clock()
        if task not in self._counts:  # its share of each position: as the partitioner's
            at = task.history_position()
            ratio = 1 / task.topic.partitions
            self._counts[task] = _Count(task.name, task.replayed, at, at, ratio, position=at - 1)

    def chunk(self, task: Replayed, rows: int, mine: int, left: int, end: int) -> None:
        """``task`` is given a chunk of ``rows`` rows, ``mine`` of them its own and
        ``left`` of those not applied yet; the next read starts at ``end``."""
        count = self._counts.get(task)
        if count is None:
            return  # following the store, not catching up
        count.left, count.at_chunk = left, self._applied(task, count)
        if end > count.end:  # a chunk read again (a retry) is not counted twice
            count.rows += rows
            count.mine += mine
            count.end = end
        if count.rows:
            count.ratio = count.mine / count.rows

    def note_stuck(self, task: Replayed, failed: bool, rows: list[StoredRow]) -> None:
        """Name the event a failed member is stuck on (status, readiness, log) from the
        ``rows`` it failed in; forget it once the member moved past it."""
        record = self.stuck.get(task)
        if failed:
            record = stuck_record(task, rows) or record
            if record is not None:
                self.stuck[task] = record
                task.stuck(record.as_dict())
        elif record is not None and task.history_position() > record.position:
            del self.stuck[task]
            task.stuck(None)

    def applying(self, task: Replayed, share: ShareInHand) -> None:
        self._inflight[task] = (share, task.replayed)

    def applied(self, task: Replayed) -> None:
        self._inflight.pop(task, None)

    def leave(self, task: Replayed, *, caught_up: bool) -> None:
        """``task`` waits no more: caught up, or stopped where it stood."""
        count = self._counts.pop(task, None)
        if count is None:
            return
        self._done += self._applied(task, count)
        if not caught_up:
            self._stopped.append(f"{count.name} at store position {self._position(task, count)}")

    def finish(self, waiting: Iterable[Replayed]) -> None:
        """Members that left without being released stopped (their catch-up was ended:
        a close, a fence); with none waiting, the catch-up ends."""
        still = set(waiting)
        for task in [t for t in self.stuck if t not in still]:
            del self.stuck[task]
            task.stuck(None)
        for task in [t for t in self._counts if t not in still]:
            self.leave(task, caught_up=False)
        if not still and self.started is not None:
            self.report(done=True)
            self._reset()

    # what it shows ---------------------------------------------------------------------
    def _applied(self, task: Replayed, count: _Count) -> int:
        done = task.replayed - count.base
        inflight = self._inflight.get(task)
        if inflight is not None:
            share, before = inflight
            done += max(0, share.taken() - 1 - (task.replayed - before))
        count.shown = max(count.shown, done)
        return count.shown

    def _position(self, task: Replayed, count: _Count) -> int:
        """The last store position ``task`` reached (its checkpoint's), at most the head."""
        count.position = max(count.position, task.history_position() - 1)
        return min(count.position, max(self.head, count.first - 1))

    def _left(self, task: Replayed, count: _Count) -> int:
        applied = self._applied(task, count)
        in_chunk = max(0, count.left - (applied - count.at_chunk))
        beyond = round(max(0, self.head - count.end + 1) * count.ratio)
        positions = max(0, self.head - self._position(task, count))
        return min(in_chunk + beyond, positions)

    def applied_events(self) -> int:
        """Events applied so far in this catch-up (committed, plus the shares in hand)."""
        return self._done + sum(self._applied(t, c) for t, c in self._counts.items())

    def left(self) -> int:
        """Events still to apply (estimated past the rows read)."""
        return sum(self._left(t, c) for t, c in self._counts.items())

    def lanes(self) -> list[dict[str, object]]:
        """Each waiting member: its store position of the head, applied and left."""
        return [
            {
                "name": count.name,
                "store_position": self._position(task, count),
                "head": self.head,
                "applied": self._applied(task, count),
                "left": self._left(task, count),
            }
            for task, count in self._counts.items()
        ]

    def status(self) -> dict[str, object]:
        if self.started is None:
            return {"active": False, "stuck": [s.as_dict() for s in self.stuck.values()]}
        elapsed = self._clock() - self.started
        applied, left = self.applied_events(), self.left()
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
            "lanes": self.lanes(),
            "stuck": [s.as_dict() for s in self.stuck.values()],
        }

    def _all_stuck(self) -> bool:
        return bool(self.stuck) and all(t in self.stuck for t in self._counts)

    def report(self, *, done: bool = False) -> None:
        """A progress line (or the bar redrawn); ``done``: the closing line."""
        if self.started is None:
            return
        elapsed = self._clock() - self.started
        applied, left = self.applied_events(), self.left()
        rate = applied / elapsed if elapsed > 0 else 0.0
        if done:
            self._end_bar()
            if not applied and not self._stopped:
                return  # at the head already (a build's last read): nothing to tell
            if self._stopped:
                log.info(
                    "catch-up stopped: %d events applied in %.1fs (%.0f ev/s); %s (store "
                    "head %d): it goes on from there at the next start",
                    applied,
                    elapsed,
                    rate,
                    ", ".join(self._stopped),
                    self.head,
                )
                return
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
