"""Which partitions this worker consumes: the seam where the membership protocol plugs in.

Today :class:`StaticMembership` owns the partitions of setting ``amqp_partitions`` (all
of them when empty: one worker), with single active consumer as the broker's safety net
when two workers claim the same partition. The next step is a membership protocol over
RabbitMQ itself (a heartbeat exchange, members agreeing on an assignment and
rebalancing within seconds, see DESIGN.md "RabbitMQ: partitions and ownership"): it
implements the same :class:`Membership` and calls the same callbacks on every change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ..app import App
from ..errors import ConfigError
from ..settings import Settings

Partitions = list[tuple[str, int]]
"""(source topic, partition) pairs."""


class Membership(Protocol):
    """Tells a source which partitions it owns, now and on every change."""

    async def start(
        self,
        assigned: Callable[[Partitions], None],
        revoked: Callable[[Partitions], Awaitable[None]],
    ) -> None:
        """Join; call ``assigned`` with this worker's partitions (and ``revoked`` before
        any of them moves to another worker)."""

    async def stop(self) -> None:
        """Leave (the partitions are released by the source)."""


class StaticMembership:
    """Owns a fixed set of partitions of every source topic, from the settings."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.owned = _owned(app, settings.owned_partitions())

    async def start(
        self,
        assigned: Callable[[Partitions], None],
        revoked: Callable[[Partitions], Awaitable[None]],
    ) -> None:
        assigned(self.owned)

    async def stop(self) -> None:
        pass


def _owned(app: App, wanted: Iterable[int] | None) -> Partitions:
    topics = {a.topic.name: a.topic.partitions for a in app.agents.values()}
    if wanted is None:
        return [(t, p) for t, n in topics.items() for p in range(n)]
    wanted = sorted(set(wanted))
    most = max(topics.values(), default=0)
    beyond = [p for p in wanted if p >= most]
    if beyond:
        raise ConfigError(
            f"setting amqp_partitions (STREAMAPP_AMQP_PARTITIONS) names partition(s) "
            f"{beyond}, but no source topic has that many (largest: {most} partitions)"
        )
    return [(t, p) for t, n in topics.items() for p in wanted if p < n]
