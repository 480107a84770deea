"""One back-off helper for every retry loop of the engine."""

from __future__ import annotations

import asyncio
import contextlib


class Pace:
    """Waits that double from ``initial_s`` to ``max_s``; a set ``stop`` ends a wait early."""

    def __init__(self, stop: asyncio.Event, initial_s: float = 0.5, max_s: float = 10.0) -> None:
        self.stop, self.initial_s, self.max_s = stop, initial_s, max_s
        self.delay = initial_s

    async def wait(self) -> None:
        """Wait the current delay (or until ``stop``), then double it."""
        await pause(self.stop, self.delay)
        self.delay = min(self.delay * 2, self.max_s)


def doubled(first_s: float, max_s: float, n: int) -> float:
    """The ``n``-th wait (1-based) of waits doubling from ``first_s`` up to ``max_s``; a
    ``first_s`` above ``max_s`` is kept, never shortened."""
    if n <= 1 or first_s <= 0:
        return max(first_s, 0.0)
    return max(first_s, min(first_s * 2.0 ** min(n - 1, 64), max_s))


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
    if seconds <= 0 or stop.is_set():
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
