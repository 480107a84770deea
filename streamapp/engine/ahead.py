"""Deliveries fetched ahead: the next batch of a partition, fetched while one runs.

A source that can keep fetching a partition while its task works (Kafka: the fetcher
runs beside the task; RabbitMQ: the broker pushes up to the prefetch) feeds with
``prefetch``: the partition is not paused for the batch, and what arrives while it runs
and commits waits here to be the next batch. So a fetch round trip never stands between
two batches, and batches grow with the load (what arrived during one commit runs in the
next) while a quiet partition still runs each delivery as it comes. At ``limit``
deliveries waiting, the partition is paused until the task takes them. A source that
cannot (the memory broker) pauses the partition for each batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records import Delivery
from .interfaces import PartitionPort


class Ahead:
    """The deliveries of one partition fetched while its batch runs."""

    def __init__(self, port: PartitionPort, limit: int) -> None:
        self.port, self.limit = port, limit
        self.prefetch = False
        """The source fetches on while a batch runs (set per :meth:`start`)."""
        self.taking = False
        """A batch runs and takes what is fetched meanwhile."""
        self.waiting: list[Delivery] = []
        self.in_hand: Sequence[Delivery] = ()
        """The batch in hand, or the last one (read by observers: :mod:`.stalled`)."""
        self._held = False
        """The partition is paused because :attr:`waiting` is full."""

    def start(self, prefetch: bool, deliveries: Sequence[Delivery] = ()) -> None:
        """A batch of ``deliveries`` starts: with ``prefetch``, take what is fetched
        meanwhile; without, pause the partition until the batch ends."""
        self.prefetch, self.in_hand = prefetch, deliveries
        if prefetch:
            self.taking = True
        else:
            self.port.pause()

    def add(self, deliveries: Sequence[Delivery]) -> None:
        """Deliveries fetched while the batch runs, in order, each once."""
        waiting = self.waiting
        if waiting and deliveries and deliveries[0].position <= waiting[-1].position:
            after = waiting[-1].position  # fetched again after a seek: taken once
            deliveries = [d for d in deliveries if d.position > after]
        waiting.extend(deliveries)
        if len(waiting) >= self.limit and not self._held:
            self._held = True
            self.port.pause()

    def take(self) -> list[Delivery]:
        """The next batch (fetching goes on for the one after)."""
        taken, self.waiting = self.waiting, []
        self.in_hand = taken
        if self._held:
            self._held = False
            self.port.resume()
        return taken

    def hold(self) -> bool:
        """Take nothing more: what waits is dropped (True: something was, so the task
        rewinds to its next position before it resumes), and a prefetching partition
        is paused."""
        self.taking = False
        dropped = bool(self.waiting)
        self.waiting = []
        if self.prefetch:
            self.port.pause()
        return dropped

    def resumed(self) -> None:
        """The task resumed the partition: nothing is held any more."""
        self._held = False
