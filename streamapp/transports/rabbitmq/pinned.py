"""Partitions pinned by setting ``amqp_partitions``: a membership with no protocol.

One worker per set of partitions, single active consumer still guarding (see
:mod:`streamapp.transports.rabbitmq.members` for the group that shares them instead).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from ...app import App
from ...errors import ConfigError
from ...settings.settings import Settings
from .membership import Partitions


class StaticMembership:
    """Owns a fixed set of partitions of every source topic, from the settings."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.owned = _owned(app, settings.owned_partitions())
        self._revoked: Callable[[Partitions], Awaitable[None]] | None = None

    @property
    def settled(self) -> bool:
        return True

    async def start(
        self,
        assigned: Callable[[Partitions], None],
        revoked: Callable[[Partitions], Awaitable[None]],
    ) -> None:
        self._revoked = revoked
        assigned(self.owned)

    async def stop(self) -> None:
        if self._revoked is not None:
            await self._revoked(self.owned)


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
