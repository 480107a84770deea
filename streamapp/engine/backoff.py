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


class Pauses:
    """The pauses a partition task chooses before it is fetched again (a Redeliver
    backoff, a table it reads unavailable): an observer tells them from a stall
    (:mod:`streamapp.engine.stalled`)."""

    def __init__(self) -> None:
        self.pausing = False
        """True while the task waits out such a pause."""
        self.count = 0
        """Such pauses since the task started."""
        self._chosen = False

    def chose(self, seconds: float) -> None:
        """The run stopped and the task pauses ``seconds`` on purpose before the next."""
        self._chosen = seconds > 0
        self.count += self._chosen

    async def wait(self, stop: asyncio.Event, seconds: float) -> None:
        """The pause before the partition is fetched again (chosen, or another's)."""
        self.pausing, self._chosen = self._chosen and seconds > 0, False
        try:
            await pause(stop, seconds)
        finally:
            self.pausing = False


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
