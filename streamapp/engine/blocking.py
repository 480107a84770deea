"""Blocking handlers (``@app.agent(..., blocking=True)``): run in a thread of their lane.

Each lane of a blocking agent (one agent in one partition task) has one daemon thread, so
deliveries of a partition run strictly in order, one at a time (the batch awaits each
call), while other partitions, the group heartbeats and the views go on in the event
loop. Occurrent gives each subscription its own thread for the same reason.

Thread safety: while a call runs, the batch task awaits it, so the lane's overlay, its
table views, its ``send`` and outbox are touched by that thread alone; the loop touches
them again only after the call returned. Reads of the stores from the thread skip
filling the stores' caches (:func:`~streamapp.tables.store.reads_from_thread`), which
the loop alone fills and writes. An ``async def`` handler declared blocking runs on an
event loop of its thread's own (it must not use clients bound to the worker's loop).

A stop waits for the call in hand as long as the partition's close budget
(``rebalance_timeout_ms / 2``); past it the batch is cancelled, nothing of it commits, and
the thread is abandoned (logged): it ends when the handler returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..tables.store import reads_from_thread

log = logging.getLogger("streamapp.agent")

_Call = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[None]", Callable[[], Any], contextvars.Context
]
"""A call for the thread: the caller's loop, its future, the call, and the caller's
context variables (the handler sees its delivery's trace span, as ``to_thread`` would)."""


class HandlerThread:
    """The thread a lane runs its blocking handler on, started at the first call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] | None = None
        self.calls = 0

    async def run(
        self, handler: Callable[..., Any], event: Any, views: Sequence[Any], send: Any
    ) -> None:
        """Call ``handler(event, *views[, send=send])`` in the thread; its exception is raised
        here. A cancellation (a stop past its budget) abandons the thread."""
        if send is None:
            call: Callable[[], Any] = lambda: handler(event, *views)  # noqa: E731
        else:
            call = lambda: handler(event, *views, send=send)  # noqa: E731
        calls = self._calls
        if calls is None:
            calls = self._calls = self._start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        calls.put((loop, done, call, contextvars.copy_context()))
        self.calls += 1
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            if not done.done():
                done.add_done_callback(_retrieve)
                self.abandon()
                log.warning(
                    "%s: the blocking handler did not return within the stop's budget; its "
                    "batch is not committed (the deliveries come again) and its thread is "
                    "left to end when the handler returns",
                    self.name,
                )
            raise

    def abandon(self) -> None:
        """Stop the thread after the call in hand; a later call starts a new one."""
        calls, self._calls = self._calls, None
        if calls is not None:
            calls.put(None)

    def _start(self) -> queue.SimpleQueue[_Call | None]:
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        thread = threading.Thread(
            target=_serve, args=(calls,), name=f"streamapp {self.name}", daemon=True
        )
        thread.start()
        return calls


def _serve(calls: queue.SimpleQueue[_Call | None]) -> None:
    """The thread: one call at a time, in order, until told to stop."""
    own_loop: asyncio.AbstractEventLoop | None = None
    try:
        while (item := calls.get()) is not None:
            loop, done, call, context = item
            reads_from_thread(loop)
            error: BaseException | None = None
            try:
                result = context.run(call)
                if inspect.isawaitable(result):  # an async handler declared blocking
                    if own_loop is None:
                        own_loop = asyncio.new_event_loop()
                    own_loop.run_until_complete(
                        own_loop.create_task(_awaited(result), context=context)
                    )
            except BaseException as exc:  # handed to the loop: the policy decides
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:  # the worker's loop is closed: nobody waits any more
                return
            del item, call, context, error
    finally:
        if own_loop is not None:
            own_loop.close()


async def _awaited(result: Any) -> None:
    await result


def _retrieve(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()  # an abandoned call's error: logged above, not left unretrieved


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
