"""What a test leaves behind: asyncio tasks still pending after it, threads (not daemon)
still running after its event loop closed. ``tests/conftest.py`` fails such a test, as
faust's suite does: a leaked task or thread is work that outlives its owner (a stop that
does not wait, a client never closed) and bleeds into the next test."""

from __future__ import annotations

import asyncio
import threading
import time

GRACE_S = 2.0
"""How long what a test cancelled or stopped last may go with none of it ending: while
its tasks (threads) keep ending, one after another, the grace goes on (a loaded machine
ends them later, not never)."""


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()} ({where})"


async def pending_tasks(before: set[asyncio.Task[object]]) -> list[str]:
    """Tasks of the running loop not in ``before`` that are still pending once the
    grace is over (those that end within it are not leaks)."""
    current = asyncio.current_task()
    left = {t for t in asyncio.all_tasks() if t is not current and t not in before}
    while left:
        ended, left = await asyncio.wait(left, timeout=GRACE_S, return_when=asyncio.FIRST_COMPLETED)
        if not ended:  # none ended within the grace
            break
    return sorted(_describe(t) for t in left if not t.done())


def running_threads(before: set[threading.Thread]) -> list[str]:
    """Threads (not daemon) not in ``before`` still alive once the grace is over."""
    left = [
        t
        for t in threading.enumerate()
        if t not in before and not t.daemon and t is not threading.current_thread()
    ]
    moved = time.monotonic()
    while (alive := [t for t in left if t.is_alive()]) and time.monotonic() - moved < GRACE_S:
        alive[0].join(0.05)
        if len([t for t in left if t.is_alive()]) < len(alive):
            moved = time.monotonic()  # one ended: the grace starts again
    return sorted(t.name for t in left if t.is_alive())
