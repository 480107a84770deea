"""Partition tasks of the unit tests over a store feed: the factory they share and a wait
until they are live, so that each test sets up only what it is about (its agent, feed,
stores and port); and what moves while an in-process worker's tasks work
(:func:`source_progress`), for a wait's progress."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamapp.catchup.feed import StoreFeed
from streamapp.codecs import kafka as codec
from streamapp.engine.assignment import LiveSource
from streamapp.engine.factory import TaskFactory
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.engine.task_config import TaskConfig
from tests.support.doubles import no_park
from tests.support.waits import frozen, until


def feed_factory(feed: StoreFeed | None = None, **config: Any) -> TaskFactory:
    """The factory of a unit test's tasks: records decoded as Kafka carries them, a park
    that never succeeds, no redelivery pause, ``feed`` as the history (``config``: more
    :class:`TaskConfig` settings, e.g. ``batch_budget_s``)."""
    return TaskFactory(
        config=TaskConfig(**{"redeliver_pause_s": 0.0, **config}),
        decode=lambda d: codec.decode(d.key, d.value, d.headers),
        park=lambda agent, name: no_park,
        history=feed,
    )


async def until_live(tasks: Sequence[PartitionTask]) -> None:
    """Until every task is live; fails once no task's phase or replayed count moved for
    :data:`~tests.support.waits.STALLED_S`."""
    await until(
        lambda: all(t.phase is Phase.LIVE for t in tasks),
        what=f"{len(tasks)} tasks live",
        progress=lambda: tuple((t.phase, t.counts.replayed) for t in tasks),
        poll_s=0.01,
    )


def source_progress(source: LiveSource | None) -> bytes:
    """What moves while an in-process worker's source works (a :class:`Worker`'s
    ``source``): whether it rebalances, and each of its partitions' status (phase,
    positions, counts, outcomes), nothing that moves with the clock alone."""
    if source is None:
        return frozen(None)
    assignment = source.assignment
    tasks = sorted(assignment.tasks.items(), key=lambda kv: kv[0])
    return frozen((assignment.rebalancing, [task.status() for _, task in tasks]))
