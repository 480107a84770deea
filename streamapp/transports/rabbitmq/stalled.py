"""Stalled partitions on RabbitMQ: deliveries wait, the owner gets none.

Each partition queue has a single active consumer. When the group moves a partition
from a worker cut off from the broker, the broker keeps that worker's consumer active
until it declares its connection dead (the AMQP heartbeat, setting ``amqp_heartbeat_s``):
meanwhile the new owner's consumer waits, its task is live and applies nothing. Such a
partition is not called live: :class:`StalledPartitions` finds it (none in hand, none
heard for :data:`STALLED_AFTER_S`, and messages ready in the queue), ``/status`` names
it ``stalled``
and ``/metrics`` counts it (``streamapp_stalled_partitions``), the worker logs it once,
and the port consumes anew (should its own registration be what stands). One concept with
the engine's stalled partitions (:mod:`streamapp.engine.stalled`, every transport): the
assignment merges both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...engine.stalled import Stalled
from .connection import close_channel
from .port import CLOSE_TIMEOUT_S, RabbitPartitionPort

log = logging.getLogger("streamapp.partition")

STALLED_AFTER_S = 3.0
"""How long a port holding nothing hears nothing while its queue has messages ready
before its partition is stalled (about the AMQP heartbeat,
``amqp_heartbeat_s``, and the membership timeout, ``amqp_session_timeout_ms``)."""

CHECK_EVERY_S = 1.0
"""How often the ports are looked at (a queue is asked only once it went quiet)."""


class StalledPartitions:
    """Finds this worker's stalled partitions (one per RabbitMQ source)."""

    def __init__(
        self,
        ports: Callable[[], Mapping[tuple[str, int], RabbitPartitionPort]],
        after_s: float = STALLED_AFTER_S,
    ) -> None:
        self._ports, self.after_s = ports, after_s
        self.since: dict[tuple[str, int], float] = {}
        """The stalled partitions, each with when (monotonic) it last heard a delivery."""
        self._why: dict[tuple[str, int], str] = {}
        """What each stalled partition was found doing (``/status``: ``stalled_doing``)."""
        self._asked: dict[tuple[str, int], float] = {}
        """When each quiet queue was last counted (at most once per ``after_s``)."""
        self._renewed: set[tuple[str, int]] = set()
        """Stalled partitions whose port consumed anew (once per stall)."""
        self._probe: Any = None
        """A channel of its own for the passive declares (a 404 closes it)."""
        self._loop: asyncio.Task[None] | None = None

    def stalled(self) -> dict[tuple[str, int], Stalled]:
        """Each stalled partition with the seconds it has been stalled, and why."""
        now = time.monotonic()
        return {
            key: Stalled(now - since, self._why.get(key, "waiting for the broker"))
            for key, since in self.since.items()
        }

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="stalled partitions")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):
                await close_channel(probe, CLOSE_TIMEOUT_S)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await self.check()
            except Exception as exc:  # the next round asks again
                log.debug("checking for stalled partitions failed: %r", exc)

    async def check(self) -> None:
        """Look at every port once: a quiet one holding nothing has its queue counted
        (at most once per ``after_s``); messages ready there make it stalled. Another
        consumer alone does not: the port may be the active one of a quiet queue (a
        cut-off worker's connection holding up to a prefetch of unacked messages shows
        no ready ones; the AMQP heartbeat ends that)."""
        ports = dict(self._ports())
        for gone in [k for k in self._asked if k not in ports]:
            self.since.pop(gone, None)
            self._renewed.discard(gone)
            del self._asked[gone]
        now = time.monotonic()
        for key, port in ports.items():
            idle = port.idle_s()
            if idle is None or idle < self.after_s:
                self.since.pop(key, None)
                self._renewed.discard(key)
                continue
            if now - self._asked.get(key, 0.0) < self.after_s:
                continue
            self._asked[key] = now
            ready, others = await self._count(port)
            if not ready or port.idle_s() is None:  # nothing waits, or it heard one
                self.since.pop(key, None)
                self._renewed.discard(key)
                continue
            if key not in self.since:
                self.since[key] = now - idle
                self._why[key] = (
                    f"no delivery while queue {port.queue} has {ready} messages ready: the "
                    "broker gives the queue to another consumer"
                )
                log.warning(
                    "%s: no delivery for %.1fs while queue %s has %d messages ready and %d "
                    "other consumer(s): the broker gives the queue to another consumer (a "
                    "worker cut off from RabbitMQ, until its AMQP heartbeat expires: setting "
                    "amqp_heartbeat_s); consuming anew",
                    port.name,
                    idle,
                    port.queue,
                    ready,
                    others,
                )
            if key not in self._renewed and await port.consume_anew():
                self._renewed.add(key)  # once per stall (a failed one is tried again)

    async def _count(self, port: RabbitPartitionPort) -> tuple[int, int]:
        """Messages ready in ``port``'s queue and its consumers other than the port's
        own ((0, 0) when it cannot be asked now)."""
        channel = port.channel
        if channel is None:
            return 0, 0
        try:
            if self._probe is None or self._probe.is_closed:
                underlay = await channel.get_underlay_channel()
                self._probe = await underlay.connection.channel(publisher_confirms=False)
            declared = await self._probe.queue_declare(port.queue, passive=True)
        except Exception as exc:  # a reconnect or a deleted queue: told elsewhere
            log.debug("%s: counting %s failed: %r", port.name, port.queue, exc)
            return 0, 0
        return int(declared.message_count or 0), max(int(declared.consumer_count or 0) - 1, 0)
