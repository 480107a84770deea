"""The event loop a worker runs on (setting ``event_loop``): asyncio's own, or uvloop.

uvloop (libuv, in C) runs the same asyncio code with less overhead per callback, socket
read and timer. On the orders projection it took 8% off the worker's CPU per event in a
profile of its own, but in the bench's alternating rounds (``streamapp uvloop``,
2026-12-03) it was level with asyncio's loop, so asyncio's stays the default. It is an
extra (``pip install -e '.[uvloop]'``); the setting says which loop runs, whatever is
installed.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import ConfigError

T = TypeVar("T")

EVENT_LOOPS = ("asyncio", "uvloop")


def loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes a loop of the kind ``event_loop`` names (None: asyncio's default);
    ConfigError naming the setting when it is unknown or uvloop is not installed."""
    if event_loop == "asyncio":
        return None
    if event_loop != "uvloop":
        raise ConfigError(
            f"setting event_loop must be one of {', '.join(EVENT_LOOPS)}, got {event_loop!r}"
        )
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        raise ConfigError(
            "setting event_loop is 'uvloop' but uvloop is not installed: install the extra "
            "(pip install -e '.[uvloop]') or set STREAMAPP_EVENT_LOOP=asyncio"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """Run ``main`` to completion on a new loop of the kind ``event_loop`` names."""
    try:
        factory = loop_factory(event_loop)
    except ConfigError:
        main.close()  # never awaited: no warning about it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
