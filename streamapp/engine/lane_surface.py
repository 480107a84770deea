"""What the failure policies and held streams read of a lane (:class:`LaneSurface`).

:class:`~streamapp.engine.lane.Lane` runs deliveries and hands a failed one to
:mod:`~streamapp.engine.settle` and :mod:`~streamapp.engine.hold`; they see the lane
through this protocol, so that they do not import the lane module that imports them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from ..agents.agent import Agent, Runner
from ..agents.outputs import Outbox, Send
from ..tables.partition import PartitionTables
from .attempts import Attempts
from .delivery import Parker


class LaneSurface(Protocol):
    """One agent's share of a partition task, as its failure policy sees it (see
    :class:`~streamapp.engine.lane.Lane` for each member)."""

    @property
    def agent(self) -> Agent: ...
    @property
    def name(self) -> str: ...
    @property
    def park(self) -> Parker: ...
    @property
    def attempts(self) -> Attempts: ...
    @property
    def tables(self) -> PartitionTables | None: ...
    @property
    def views(self) -> list[Any]: ...
    @property
    def outbox(self) -> Outbox | None: ...
    @property
    def send(self) -> Send | None: ...
    @property
    def run(self) -> Runner | None: ...
    @property
    def stop(self) -> asyncio.Event: ...
    @property
    def waits(self) -> bool: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def copies(self) -> dict[str, int]:
        """Chain copies of the open batch, by kind (the policy counts its copy here)."""
        ...

    @property
    def hops(self) -> dict[tuple[str, int], int]:
        """Chain copies of the open batch, by (kind, ``x-retry-hop``)."""
        ...
