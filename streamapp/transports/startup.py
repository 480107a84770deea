"""Start-up retries (setting ``startup_retry``): connecting and checking the topology.

A worker may start before its broker answers or before ``streamapp topics create`` made
its topics (a deployment that starts both at once). :func:`retry_startup` calls a start
step until it succeeds, and what is retried is decided by the error alone:
:attr:`StreamappError.retriable <streamapp.errors.StreamappError.retriable>` (a client
error is first made a streamapp error by the transport's ``classify``). A missing topic
or a broker not answering is retried; a wrong partition count or a bad setting fails at
once. Nested steps (a topic check that connects) share the outermost step's attempts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

from ..errors import StreamappError
from ..settings.settings import Settings

log = logging.getLogger("streamapp.startup")
T = TypeVar("T")

Classify = Callable[[Exception], StreamappError | None]
"""A client error as the streamapp error it is (None: not the transport's, raise it)."""

_inside: ContextVar[bool] = ContextVar("streamapp_startup_retry", default=False)


async def retry_startup(
    settings: Settings, what: str, step: Callable[[], Awaitable[T]], classify: Classify
) -> T:
    """``await step()``, again after a retriable failure, up to ``startup_retry.attempts``
    tries (back-off between them); each retry's line names the attempt and the budget,
    and the last failure is raised as a streamapp error saying the attempts it took."""
    if _inside.get():  # the outer step retries the whole of it
        return await _once(step, classify)
    delays = settings.startup_retry.delays()
    token = _inside.set(True)
    try:
        budget = len(delays) + 1
        for attempt in range(budget):
            try:
                return await _once(step, classify)
            except StreamappError as exc:
                if not exc.retriable:
                    raise
                if attempt == len(delays):
                    if budget > 1:  # the message says the budget it spent
                        said = str(exc).rstrip(".")
                        stop = "" if said.endswith("?") else "."
                        exc.args = (
                            f"{said}{stop} Gave up after {budget} attempts (setting "
                            "startup_retry).",
                        )
                    raise
                log.info(
                    "%s: attempt %d of %d failed: %s; retrying in %.1fs",
                    what,
                    attempt + 1,
                    budget,
                    exc,
                    delays[attempt],
                )
                await asyncio.sleep(delays[attempt])
    finally:
        _inside.reset(token)
    raise AssertionError("unreachable")


async def _once(step: Callable[[], Awaitable[T]], classify: Classify) -> T:
    try:
        return await step()
    except StreamappError:
        raise
    except Exception as exc:
        error = classify(exc)
        if error is None:
            raise
        raise error from exc
