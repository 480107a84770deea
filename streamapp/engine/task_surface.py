"""The partition task's public surface, as the modules it delegates to see it.

:class:`~streamapp.engine.task.PartitionTask` imports the modules that open it
(:mod:`~.opening`), rebuild it (:mod:`~.rebuild`), recover it (:mod:`~.recover`), replay
into it (:mod:`~.replay`) and build a lane beside it (:mod:`~.lane_build`); they take
the task as a :class:`TaskSurface`, so that none of them imports the task back (Kafka
Streams' ``TaskExecutor`` drives a ``Task`` through its interface alone). mypy checks
that the task is one wherever it is passed. The task's replay and its builds are seen
through :class:`ReplaySurface` and :class:`BuildSurface` for the same reason, and the
task sees its factory as :class:`TaskParts`.

The event-store feed (:class:`~streamapp.catchup.StoreFeed`, a :class:`HistoryFeed`)
sees a partition through :class:`Replayed`: where it stands in the store, whether it
wants events now, and the one call that applies a share of a stored chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from ..agents.agent import Agent
from ..records import Delivery
from ..tables.checkpoint import Checkpoint
from ..tables.reads import Locator
from ..topics import TopicSpec
from .attempts import Attempts
from .commit import Commit
from .delivery import Decoder
from .interfaces import PartitionPort, Publish, TaskMetrics, Transaction
from .lane import Lane
from .phase import LiveState, Phase
from .provenance import StoreIdentity
from .state import PartitionState
from .status import TaskCounts
from .task_config import TaskConfig


class Replayed(Protocol):
    """A partition as the event-store feed sees it."""

    @property
    def name(self) -> str: ...
    @property
    def topic(self) -> TopicSpec: ...
    @property
    def partition(self) -> int: ...
    @property
    def replayed(self) -> int:
        """Stored events it settled so far."""
        ...

    @property
    def catching_up(self) -> bool:
        """True while it waits for the store's head (live deliveries wait)."""
        ...

    @property
    def live(self) -> bool:
        """True while it is live (the feed follows it when the store is its source)."""
        ...

    @property
    def building(self) -> bool:
        """True for lanes that build beside live ones (:mod:`~streamapp.engine.lane_build`):
        the feed serves whole partitions first."""
        ...

    @property
    def stopped(self) -> bool:
        """True once it takes no more events here (closed, fenced, failed)."""
        ...

    def history_position(self) -> int:
        """The next event-store position it needs (1: nothing replayed)."""
        ...

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        """Apply its share of a chunk read from ``start`` (its position when the share
        was cut) up to ``next_position`` (see :class:`Replay`)."""
        ...

    def retry_pause_s(self) -> float:
        """The pause before the feed gives it a failed event again."""
        ...

    def failing(self) -> list[Attempts]:
        """The failed attempts of its lanes at or after its store position."""
        ...

    def stuck(self, on: dict[str, object] | None) -> None:
        """The stored event it is stuck on (shown by status), or None once past it."""
        ...

    def follow(self, on: bool) -> None:
        """The store is (True) or is no longer (False) its live source."""
        ...


class HistoryFeed(Protocol):
    """Replays the event store into partitions that catch up (one reader per worker)."""

    async def catch_up(self, partition: Replayed, *, fresh: bool = False) -> None:
        """Return once ``partition``'s tables hold every stored event of it up to the
        store's head (the feed calls :meth:`Replayed.apply_history`); ``fresh``: up to
        the head of a read issued after this call (what was stored before it is in)."""

    async def live_start(self, partition: Replayed) -> int | None:
        """Where the live source should start after the handover (None: unknown)."""
        ...

    async def identity(self) -> StoreIdentity:
        """The event store read, as checkpoints are checked against it."""
        ...


class ReplaySurface(Replayed, Protocol):
    """What the task's helpers use of its replay (:class:`~streamapp.engine.replay.Replay`)."""

    lanes: list[Lane]
    """The lanes the event store feeds: catching up, or following the store."""

    @property
    def follows_store(self) -> bool:
        """True when the event store is the task's live source (STREAMAPP_BROKER=none)."""
        ...

    async def catch_up(self) -> None:
        """At the open: replay the lanes not caught up up to the store's head."""

    def recheck(self) -> None:
        """Before the next live batch, replay what another consumer may have taken."""

    async def run(self) -> None:
        """The event-store feed's catch-up of :attr:`lanes`."""


class BuildSurface(Protocol):
    """A lane build as its task holds it (:class:`~streamapp.engine.lane_build.LaneBuild`)."""

    @property
    def work(self) -> asyncio.Future[Any] | None:
        """The part being applied (the task's close waits for it)."""
        ...

    def start(self) -> None:
        """Build in the background; the task is live meanwhile."""

    async def stop(self) -> None:
        """Stop the build (its checkpoint holds), after the part in hand."""


class TaskSurface(Protocol):
    """What the task's helpers read and call of a partition task (see
    :class:`~streamapp.engine.task.PartitionTask` for each member)."""

    @property
    def name(self) -> str: ...
    @property
    def topic(self) -> TopicSpec: ...
    @property
    def partition(self) -> int: ...
    @property
    def port(self) -> PartitionPort: ...
    @property
    def config(self) -> TaskConfig: ...
    @property
    def metrics(self) -> TaskMetrics: ...
    @property
    def transaction(self) -> Transaction | None: ...
    @property
    def history(self) -> HistoryFeed | None: ...
    @property
    def lanes(self) -> list[Lane]: ...
    @property
    def state(self) -> PartitionState: ...
    @property
    def committer(self) -> Commit: ...
    @property
    def counts(self) -> TaskCounts: ...
    @property
    def replay(self) -> ReplaySurface: ...
    @property
    def builds(self) -> list[BuildSurface]: ...
    @property
    def closing(self) -> asyncio.Event: ...
    @property
    def turn(self) -> asyncio.Lock: ...
    @property
    def batch(self) -> asyncio.Future[Any] | None: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def next_position(self) -> int | None: ...

    @property
    def busy(self) -> bool: ...
    @property
    def live_state(self) -> LiveState: ...
    @property
    def reseek(self) -> bool: ...
    @property
    def lanes_building(self) -> bool: ...

    joining: int

    def track(self, work: asyncio.Future[Any]) -> None: ...
    def run_batch(self, work: Coroutine[Any, Any, None], name: str) -> None: ...
    def place(self, position: int, *, start: bool = False) -> None: ...
    def transition_to(self, phase: Phase) -> None: ...
    def transition_lane(self, lane: Lane, phase: Phase) -> None: ...
    def transition_if_open(self, phase: Phase, lane: Lane | None = None) -> bool: ...
    def set_live_state(self, to: LiveState, *, was: LiveState) -> None: ...
    def fail(self, exc: BaseException, message: str) -> None: ...
    def mark_lost(self, exc: BaseException) -> None: ...
    def refuse(self, reason: str) -> None: ...
    def hold_ahead(self) -> None: ...
    def rewind(self, position: int) -> None: ...
    async def commit(
        self, settle_at: int | None, checkpoint: Callable[[Lane, Checkpoint], Checkpoint]
    ) -> None: ...
    async def recover(self) -> bool: ...


class TaskParts(Protocol):
    """What a task takes from the factory that makes it
    (:class:`~streamapp.engine.factory.TaskFactory`, which imports the task)."""

    @property
    def config(self) -> TaskConfig: ...
    @property
    def metrics(self) -> TaskMetrics: ...
    @property
    def history(self) -> HistoryFeed | None: ...
    @property
    def publish(self) -> Publish | None: ...
    @property
    def locate(self) -> Locator: ...
    @property
    def on_fatal(self) -> Callable[[BaseException], None] | None: ...

    def decode_for(self, topic: TopicSpec, agents: Sequence[Agent]) -> Decoder: ...
    def lanes(self, agents: Sequence[Agent], name: str, closing: asyncio.Event) -> list[Lane]: ...
