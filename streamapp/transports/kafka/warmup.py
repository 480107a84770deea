"""The warm-up probe (:mod:`.assignor` rule 6, KIP-441's probing rebalance): once every
warm-up standby the assignor gave this worker has caught up, ask the group to rebalance,
so that the assignor moves their partitions here and each restores only its tail."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

from ...engine.phase import LiveState, Phase
from ...engine.task import PartitionTask
from .assignor import ACCEPTABLE_LAG

log = logging.getLogger("streamapp.kafka")

HOLD_S = 30.0
"""How long the probe waits for this worker's opening partitions at most."""


class WarmupProbe:
    """The warm-up standbys of the last assignment, and when to ask for their move."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self.warmups: frozenset[TopicPartition] = frozenset()
        self._held: float | None = None

    def poll(
        self, tasks: Iterable[PartitionTask], lags: Callable[[], Mapping[TopicPartition, int]]
    ) -> None:
        """Ask for the rebalance when every warm-up standby is caught up (``lags()``:
        each standby's records behind, asked only while warm-ups are due: this runs
        before every poll of the consumer) and no partition of this worker is opening."""
        if not self.warmups or not self._may_ask(tasks):
            return
        behind = lags()
        if all(0 <= behind.get(tp, -1) <= ACCEPTABLE_LAG for tp in self.warmups):
            names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(self.warmups))
            log.info("warm-up standbys of %s caught up: asking the group to rebalance", names)
            self.warmups = frozenset()
            request_rejoin(self._consumer)

    def _may_ask(self, tasks: Iterable[PartitionTask]) -> bool:
        """No partition of this worker is opening or rejoining, or one has been for
        HOLD_S. A rebalance asked for meanwhile would revoke it (a fail-over's promoted
        standby among them): a task is kept over a rebalance only when live and idle, so
        it would close and open again, unavailable meanwhile. Bounded: an opening that
        keeps failing must not hold the warm-up's move back for good."""
        opening = any(
            task.phase in (Phase.RESTORING, Phase.CATCHING_UP)
            or (task.phase is Phase.LIVE and task.live_state is LiveState.REJOINING)
            for task in tasks
        )
        if not opening:
            self._held = None
            return True
        now = time.monotonic()
        if self._held is None:
            self._held = now
        return now - self._held >= HOLD_S


def request_rejoin(consumer: AIOKafkaConsumer) -> None:
    """Make ``consumer`` join its group again (a rebalance). aiokafka has it on its group
    coordinator only (``request_rejoin``), with no public accessor."""
    coordinator = getattr(consumer, "_coordinator", None)
    rejoin = getattr(coordinator, "request_rejoin", None)
    if callable(rejoin):
        rejoin()
    else:
        log.warning("the consumer cannot be asked to rejoin its group: no probing rebalance")
