"""What a test leaves behind: asyncio tasks still pending after it, threads (not daemon)
still running after its event loop closed. ``tests/conftest.py`` fails such a test, as
faust's suite does: a leaked task or thread is work that outlives its owner (a stop that
does not wait, a client never closed) and bleeds into the next test."""

from __future__ import annotations

import asyncio
import threading

GRACE_S = 2.0
"""How long what a test cancelled or stopped last may take to end by itself."""


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()} ({where})"


async def pending_tasks(before: set[asyncio.Task[object]]) -> list[str]:
    """Tasks of the running loop not in ``before`` that are still pending once the
    grace is over (those that end within it are not leaks)."""
    current = asyncio.current_task()
    left = {t for t in asyncio.all_tasks() if t is not current and t not in before}
    if left:
        await asyncio.wait(left, timeout=GRACE_S)
    return sorted(_describe(t) for t in left if not t.done())


def running_threads(before: set[threading.Thread]) -> list[str]:
    """Threads (not daemon) not in ``before`` still alive once the grace is over."""
    left = [
        t
        for t in threading.enumerate()
        if t not in before and not t.daemon and t is not threading.current_thread()
    ]
    for thread in left:
        thread.join(GRACE_S / max(len(left), 1))
    return sorted(t.name for t in left if t.is_alive())
