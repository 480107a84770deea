"""Partitions in time: each live partition's lag in seconds, and the stalled ones.

**Lag in seconds** is the age of the oldest event a live partition has not applied (0
when it has none): per partition and per agent (lane), on ``/metrics``
(``streamapp_lag_seconds``) and ``/status`` (``lag_s``). The age is read from the
event's **record timestamp** (Kafka: when the record entered its topic, the producer's
send time or the broker's append time on a ``LogAppendTime`` topic): how long it has
waited for this worker. Not the CloudEvents ``time``, which is when the event happened
by its producer's word (a replayed import of last year's events would read a year).
Nothing is done per record for it: the timestamp aiokafka decodes anyway is kept on the
delivery, and the age is computed when ``/metrics`` or ``/status`` is read, from what the
task holds (the batch in hand, what was fetched ahead); a Kafka partition whose next
record is not fetched yet (its end is known from the last fetch, its timestamp only
once fetched) reads what this worker measured itself (below).

*Clocks.* The timestamp comes from another host's clock (the producer's or the
broker's). An age is never below 0, and never below what this worker measured on its
own monotonic clock since it first saw that event unapplied (:class:`PartitionStalls`
looks every ``check_s``): a worker whose clock lags the producer's still shows a stuck
partition's age grow. No decision rests on the timestamp: the stall rule below uses this
worker's monotonic clock alone.

**Stalled**: a live partition that has events to apply (past its next position at the
partition's end, where the transport knows it, or held by its task) and applied none,
nor started a handler on a later one, for setting ``stall_after_s``, while its task is
not waiting out a pause it chose (a Redeliver backoff, a table it reads unavailable:
:class:`~streamapp.engine.backoff.Pauses`; any such pause restarts the count). It is named
in ``/status`` (phase ``stalled``, ``stalled_s``, ``stalled_doing``), counted by
``streamapp_stalled_partitions`` (with the RabbitMQ partitions whose queue the broker
gives to another consumer, :mod:`streamapp.transports.rabbitmq.stalled`: one concept), logged once
(WARNING) with what it was doing (the agent and record of the loop-stall watchdog's
:data:`~streamapp.engine.stall.DOING`, and the line its batch waits on), and ``/readyz``
answers 503 while every partition of an agent here is stalled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..records import Delivery, DeliveryRecord
from .phase import Phase
from .stall import DOING, awaiting, describe

if TYPE_CHECKING:
    from .task import PartitionTask

log = logging.getLogger("streamapp.partition")

Key = tuple[str, int]


class Stalled(NamedTuple):
    """A stalled partition: for how long, and what it was doing when it was found."""

    seconds: float
    doing: str


def unapplied(task: PartitionTask, start: int | None = None) -> Delivery | None:
    """The oldest live delivery at or past ``start`` (default: the task's next position)
    that ``task`` holds, in hand or fetched ahead."""
    start = task.next_position if start is None else start
    if start is None:
        return None
    for deliveries in (task.ahead.in_hand, task.ahead.waiting):
        if deliveries and deliveries[-1].position >= start:
            return deliveries[bisect_left(deliveries, start, key=_position)]
    return None


def behind(task: PartitionTask, start: int | None = None) -> bool:
    """True when the live partition has events past ``start`` (default: the task's next
    position) to apply: at its end as last seen (where the transport knows it), or held."""
    start = task.next_position if start is None else start
    if task.phase is not Phase.LIVE or start is None:
        return False
    end = task.port.end()
    return (end is not None and end > start) or unapplied(task, start) is not None


def lag_seconds(task: PartitionTask, start: int | None = None, seen_s: float = 0.0) -> float | None:
    """The age of the oldest event past ``start`` (default: the task's next position) not
    applied: 0 when there is none, at least ``seen_s`` (what this worker measured);
    None when the partition is not live (no live position yet)."""
    start = task.next_position if start is None else start
    if task.phase is not Phase.LIVE or start is None:
        return None
    if not behind(task, start):
        return 0.0
    age = seen_s
    oldest = unapplied(task, start)
    if type(oldest) is DeliveryRecord and oldest.timestamp_ms and oldest.timestamp_ms > 0:
        age = max(age, time.time() - oldest.timestamp_ms / 1000)
    return age


def doing(task: PartitionTask) -> str:
    """What ``task`` is doing, for a stall's log line and ``/status``."""
    batch = task.batch
    if batch is not None and not batch.done():
        where = awaiting(batch)
        running = DOING.get(batch) if isinstance(batch, asyncio.Task) else None
        if running is not None:
            agent, record, item = running
            return f"agent {agent!r} handling {describe(record, item)}, waiting at {where}"
        return f"its batch is at {where} (no handler runs)"
    held = unapplied(task)
    if held is not None:
        return f"it holds {held.topic}[{held.partition}]@{held.position} and runs no batch"
    return (
        f"nothing fetched past position {task.next_position} although the partition ends "
        f"at {task.port.end()}"
    )


@dataclass(slots=True)
class _Seen:
    """What the watch saw of one task."""

    task: PartitionTask
    next: int | None
    """The task's next position when last looked at."""
    since: float
    """When (monotonic) the watch first saw the event at ``next`` unapplied."""
    reached: int
    """The furthest the task got: its next position, or a later delivery in a handler."""
    pauses: int
    quiet_since: float
    """Since when (monotonic) it got no further and chose no pause."""
    stalled: Stalled | None = None


class PartitionStalls:
    """Looks at a worker's live partitions every ``check_s``: finds the stalled ones and
    keeps when each one's oldest unapplied event was first seen (the lag's lower bound)."""

    def __init__(
        self,
        tasks: Callable[[], Mapping[Key, PartitionTask]],
        after_s: float,
        check_s: float | None = None,
    ) -> None:
        self._tasks, self.after_s = tasks, after_s
        self.check_s = check_s if check_s is not None else min(max(after_s / 4, 0.05), 1.0)
        self._seen: dict[Key, _Seen] = {}
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="stalled partitions watch")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                self.check()
            except Exception as exc:  # an observer: the next look tries again
                log.debug("looking for stalled partitions failed: %r", exc)

    def stalled(self) -> dict[Key, Stalled]:
        """Each stalled partition, with for how long it has been getting nowhere."""
        now = time.monotonic()
        return {
            key: Stalled(now - seen.quiet_since, seen.stalled.doing)
            for key, seen in self._seen.items()
            if seen.stalled is not None
        }

    def seen_s(self, key: Key, task: PartitionTask) -> float:
        """How long this worker has seen ``task``'s oldest unapplied event (0: not seen)."""
        seen = self._seen.get(key)
        if seen is None or seen.task is not task or seen.next != task.next_position:
            return 0.0
        return time.monotonic() - seen.since

    def check(self) -> None:
        """One look at every task (see the module docstring)."""
        tasks = dict(self._tasks())
        now = time.monotonic()
        for key in [k for k, s in self._seen.items() if tasks.get(k) is not s.task]:
            self._cleared(self._seen.pop(key), "it is not owned here any more")
        for key, task in tasks.items():
            seen = self._seen.get(key)
            if not behind(task):
                if seen is not None:
                    del self._seen[key]
                    self._cleared(seen, "it applied every event it had")
                continue
            reached = _reached(task)
            if seen is None:
                self._seen[key] = _Seen(
                    task, task.next_position, now, reached, task.pauses.count, now
                )
                continue
            if seen.next != task.next_position:
                seen.next, seen.since = task.next_position, now
            pauses = task.pauses
            if reached > seen.reached or pauses.pausing or pauses.count != seen.pauses:
                seen.reached, seen.pauses, seen.quiet_since = (
                    max(reached, seen.reached), pauses.count, now,
                )  # fmt: skip
                self._cleared(seen, "it applies events again")
                continue
            if seen.stalled is None and now - seen.quiet_since >= self.after_s:
                seen.stalled = Stalled(now - seen.quiet_since, doing(task))
                log.warning(
                    "%s is stalled: it has events to apply (next position %s, partition end "
                    "%s) and applied none for %.1fs (setting stall_after_s = %g): %s",
                    task.name,
                    task.next_position,
                    task.port.end(),
                    now - seen.quiet_since,
                    self.after_s,
                    seen.stalled.doing,
                )

    @staticmethod
    def _cleared(seen: _Seen, why: str) -> None:
        if seen.stalled is not None:
            log.info("%s is not stalled any more: %s", seen.task.name, why)
            seen.stalled = None


def _reached(task: PartitionTask) -> int:
    """The furthest ``task`` got: its next position, or the delivery a handler runs."""
    reached = task.next_position or 0
    batch = task.batch
    running = DOING.get(batch) if isinstance(batch, asyncio.Task) else None
    return max(reached, running[1].position) if running is not None else reached


def _position(delivery: Delivery) -> int:
    return delivery.position
