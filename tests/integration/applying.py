"""How long each partition went without applying an event, seen from outside.

Every ``poll_s`` the workers' ``/status`` is read; a partition applied something when
any worker's count for it (``processed`` live plus ``replayed`` from the store) went up
since the last read. While the watch runs, the longest time between two such reads is
kept per partition: a partition that the group gave to a worker the broker does not
serve (a single active consumer still held by a cut-off connection) shows as a gap.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .harness import WorkerProc


class Applying:
    """The longest time each partition applied nothing while events kept coming."""

    def __init__(self, workers: list[WorkerProc], poll_s: float = 0.5) -> None:
        self.workers, self.poll_s = workers, poll_s
        self.gaps: dict[str, float] = {}
        """Per partition name, the longest time without an event applied (seconds)."""
        self.phases: dict[str, set[str]] = {}
        """Per partition name, the phases its owners' ``/status`` gave it."""
        self._counts: dict[tuple[int, str], int] = {}
        self._applied: dict[str, float] = {}
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            statuses = await asyncio.gather(*(w.status() for w in self.workers))
            now = time.monotonic()
            for worker, status in zip(self.workers, statuses, strict=True):
                self._take(worker.port, status, now)
            for name, at in self._applied.items():
                self.gaps[name] = max(self.gaps.get(name, 0.0), now - at)
            await asyncio.sleep(self.poll_s)

    def _take(self, port: int, status: dict[str, Any] | None, now: float) -> None:
        if status is None:
            return
        for name, partition in status["partitions"].items():
            self.phases.setdefault(name, set()).add(partition["phase"])
            count = int(partition["processed"]) + int(partition["replayed"])
            before = self._counts.get((port, name))
            self._counts[(port, name)] = count
            if name not in self._applied or (before is not None and count > before):
                self._applied[name] = now

    def longest(self) -> tuple[str, float]:
        """The partition that went longest without applying, and for how long."""
        name = max(self.gaps, key=lambda n: self.gaps[n], default="")
        return name, self.gaps.get(name, 0.0)
