"""The partition task: the life of one source partition, the same for every transport.

The task (Kafka Streams' ``StreamTask``) holds the phase machine (a checked
:class:`~streamapp.engine.phase.PhaseMachine`: its phase, its lanes', its live state), runs
batches through every agent of the topic (each a lane, :mod:`~streamapp.engine.lane`),
commits them in the one documented order (:mod:`~streamapp.engine.commit`) and rewinds
with back-off when a commit fails (:mod:`~streamapp.engine.recover`). It delegates the
rest: opening and going live (:mod:`~.opening`, :mod:`~.start_plan`), the stores
(:mod:`~.state`), the event-store replay (:mod:`~.replay`), rebuilding a corrupt store
(:mod:`~.rebuild`), what is fetched while a batch runs (:mod:`~.ahead`). Sources make
tasks with a :class:`~.factory.TaskFactory`; observers read :meth:`~PartitionTask.status`;
the helpers see the task as a :class:`~.task_surface.TaskSurface` (no import cycle).

The transport gives it a :class:`~.interfaces.PartitionPort` and, where batches must
survive a move atomically, a :class:`~.interfaces.Transaction` (else derived events go
out through ``publish``, confirmed, before the store write and the settle). The source's
poll loop keeps polling (heartbeats, other partitions) while the task works.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from ..agents.agent import Agent
from ..errors import AgentRefusedError, FencedError, StoreBehindError, StoreCorruptError
from ..failures.outcomes import Outcome
from ..records import Delivery
from ..tables.checkpoint import Checkpoint
from ..tables.partition import PartitionTables
from .ahead import Ahead
from .attempts import Attempts
from .backoff import Pauses
from .commit import Commit
from .interfaces import PartitionPort, Transaction
from .lane import Lane
from .opening import open_partition, rejoin_partition, suspend_partition
from .phase import LiveState, Phase, PhaseMachine
from .rebuild import rebuild_damaged, store_damaged
from .recover import recover
from .replay import Replay, store_position
from .resume import resume_points
from .run import SKIP, Run, run_lanes
from .state import PartitionState, StoreOpener
from .status import TaskCounts, TaskStatus, outcomes_of
from .task_surface import BuildSurface, TaskParts

log = logging.getLogger("streamapp.partition")


class PartitionTask:
    """Processes one partition of one source topic through every agent of the topic."""

    def __init__(
        self,
        agents: Sequence[Agent],
        partition: int,
        port: PartitionPort,
        *,
        name: str,
        factory: TaskParts,
        open_store: StoreOpener | None = None,
        transaction: Transaction | None = None,
    ) -> None:
        config = factory.config
        self.topic: Final = agents[0].topic
        self.partition: Final = partition
        self.port: Final = port
        self.name: Final = name
        self.config: Final = config
        self.metrics: Final = factory.metrics
        self.transaction: Final = transaction
        self.history: Final = factory.history
        self._decode, self._on_fatal = factory.decode_for(self.topic, agents), factory.on_fatal
        self.closing = asyncio.Event()
        """Set by :meth:`close`: ends a redelivery pause, a replay wait, a retry."""
        self.lanes: Final = factory.lanes(agents, name, self.closing)
        self.committer = Commit(self.lanes, port, transaction, factory.publish, self.metrics)
        self.counts: Final = TaskCounts()
        self.state: Final = PartitionState(
            self.lanes, partition, self.topic, name=name, open_store=open_store,
            transaction=transaction, locate=factory.locate, metrics=self.metrics,
            counts=self.counts, replayable=factory.history is not None,
            on_damage=lambda lane, damage: store_damaged(self, lane, damage),
        )  # fmt: skip
        self.replay: Final = Replay(self, factory.history)
        self.machine: Final = PhaseMachine(name, self.lanes)
        """The task's phase, its lanes' and its live state (:mod:`~.phase`)."""
        self._fatal: BaseException | None = None
        self._next: int | None = None
        self._start: int | None = None
        self._opening: asyncio.Task[None] | None = None
        self._batch: asyncio.Future[Any] | None = None
        self._reseek = False
        self.ahead: Final = Ahead(port, config.max_batch_records)
        """What the source fetched while the batch in hand runs: the next batch."""
        self.joining = 0
        """Building lanes waiting for the task to be idle to join (engine.build): a
        batch then ends after itself instead of running what was queued meanwhile."""
        self.turn: Final = asyncio.Lock()
        """Held by a live batch, and by each part of a building lane's replay, so that
        the two take turns (each commits its own work, never the other's)."""
        self.builds: list[BuildSurface] = []
        """Lanes catching up on their own while the others are live (engine.build)."""
        self.pauses: Final = Pauses()
        """The pauses it chooses (a Redeliver backoff): no stall (engine.stalled)."""

    # what observers read ---------------------------------------------------------------
    @property
    def agent(self) -> Agent:
        """The topic's first agent (the only one, usually)."""
        return self.lanes[0].agent

    @property
    def tables(self) -> PartitionTables | None:
        """The first agent's tables of this partition (see :meth:`tables_for`)."""
        return self.lanes[0].tables

    @property
    def attempts(self) -> Attempts:
        """The first agent's failed attempts (see :class:`~streamapp.engine.lane.Lane`)."""
        return self.lanes[0].attempts

    @property
    def outcomes(self) -> dict[Outcome, int]:
        """Outcomes of every delivery handled, live and replayed, summed over the agents."""
        return outcomes_of(self.lanes)

    @property
    def busy(self) -> bool:
        """True while nothing is fed to the task: its :attr:`live_state` is not idle."""
        return self.machine.live_state is not LiveState.IDLE

    @property
    def live_state(self) -> LiveState:
        """What the task is doing while live (changed by :meth:`set_live_state` alone)."""
        return self.machine.live_state

    def set_live_state(self, to: LiveState, *, was: LiveState) -> None:
        """``was`` ends, ``to`` starts, checked (:meth:`~.PhaseMachine.set_live_state`)."""
        self.machine.set_live_state(to, was=was)

    @property
    def reseek(self) -> bool:
        """Deliveries were dropped (fetched ahead, not accepting): rewind before resuming."""
        return self._reseek

    @property
    def lanes_building(self) -> bool:
        """A lane catches up on its own beside the live ones (:mod:`~.lane_build`)."""
        return any(lane.building for lane in self.lanes)

    @property
    def ahead_waiting(self) -> bool:
        """Deliveries fetched ahead wait to run after the batch in hand (:mod:`~.ahead`)."""
        return bool(self.ahead.waiting)

    @property
    def damaged(self) -> bool:
        """A store was found corrupt and is not rebuilt yet (:mod:`~.rebuild`)."""
        return bool(self.state.damaged)

    @property
    def is_closing(self) -> bool:
        """:meth:`close` began: work in hand ends, nothing new starts."""
        return self.closing.is_set()

    @property
    def batch(self) -> asyncio.Future[Any] | None:
        """The batch in hand (a close waits for it), if any."""
        return self._batch

    def track(self, work: asyncio.Future[Any]) -> None:
        """``work`` is the batch in hand from now on (a replayed share, a rebuild)."""
        self._batch = work

    def run_batch(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as the batch in hand; what it raises stops the partition."""
        self._batch = asyncio.create_task(work, name=name)
        self._batch.add_done_callback(self._batch_done)

    def place(self, position: int, *, start: bool = False) -> None:
        """The source position the task takes next (``start``: the term starts there, so
        nothing dropped before it is owed a rewind)."""
        self._next = position
        if start:
            self._start = position
            self._reseek = False

    @property
    def fatal(self) -> BaseException | None:
        """Why this partition stopped for good here (see :meth:`_fail`)."""
        return self._fatal

    @property
    def next_position(self) -> int | None:
        """The next live position of the partition (settled below it)."""
        return self._next

    @property
    def lag(self) -> int | None:
        """Live deliveries of this partition not yet committed, when the transport knows
        the partition's end cheaply (None: unknown, or not live yet)."""
        end = self.port.end()
        return None if end is None or self._next is None else max(end - self._next, 0)

    def status(self) -> dict[str, object]:
        """What ``/status`` shows of this partition (see :class:`~.status.TaskStatus`)."""
        return TaskStatus.of(self, self._start).as_dict()

    # the phase machine -------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        """Where the task stands (changed by :meth:`transition_to` alone)."""
        return self.machine.phase

    def transition_to(self, phase: Phase) -> None:
        """Move the task and its lanes to ``phase``, checked (:class:`~.PhaseMachine`)."""
        self.machine.transition_to(phase)

    def transition_lane(self, lane: Lane, phase: Phase) -> None:
        """Move one lane to ``phase`` (building beside live lanes; its handover), checked."""
        self.machine.transition_lane(lane, phase)

    def transition_if_open(self, phase: Phase, lane: Lane | None = None) -> bool:
        """For work that can race the close: a move dropped (logged) once closed."""
        return self.machine.transition_if_open(phase, lane)

    @property
    def accepting(self) -> bool:
        """True when live deliveries may be fed (live and idle)."""
        return self.phase is Phase.LIVE and not self.busy

    def start(self) -> None:
        """Pause the partition, then open, restore and catch up in the background."""
        self.port.pause()
        self._opening = asyncio.create_task(self.open(), name=f"open {self.name}")
        self._opening.add_done_callback(self._opening_done)

    # kept across a rebalance -----------------------------------------------------
    async def suspend(self) -> bool:
        """The group revokes the partition, and may hand it back in the same rebalance:
        keep it (see :func:`~.opening.suspend_partition`); False: the caller closes it."""
        return await suspend_partition(self)

    def rejoin(self, *, continuous: bool = False) -> None:
        """The partition came back after :meth:`suspend`: take deliveries again, with no
        store reopen; unless ``continuous`` (the next generation gave it back: no one
        else held it), fence and restore what another owner committed first."""
        self.transition_to(Phase.LIVE)  # fed again once caught up (rejoin_partition)
        self.set_live_state(LiveState.REJOINING, was=LiveState.SUSPENDED)
        self.port.pause()
        rejoining = rejoin_partition(self, continuous=continuous)
        self._opening = asyncio.create_task(rejoining, name=f"rejoin {self.name}")
        self._opening.add_done_callback(self._opening_done)

    def _opening_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.fail(exc, f"{self.name}: cannot open: {exc}")

    def fail(self, exc: BaseException, message: str) -> None:
        """Stop this partition for good here: logged once, and the source is told, so the
        worker stops and leaves the group (the partition stays paused meanwhile)."""
        if self.phase is not Phase.FAILED:  # a batch, an opening may die after a close
            self.transition_if_open(Phase.FAILED)
        if self._fatal is not None:
            return
        self._fatal = exc
        if self._on_fatal is None:
            log.error("%s; the partition stays paused", message)
            return
        log.error("%s; the worker stops so that another one takes the partition over", message)
        self._on_fatal(exc)

    async def open(self) -> None:
        """Open, restore, catch up and go live (see :func:`~.opening.open_partition`)."""
        await open_partition(self)

    async def close(self) -> None:
        """Finish the batch in hand (it commits), then close the transaction and stores."""
        self.transition_if_open(Phase.CLOSED)  # closed twice: the second move is dropped
        self.closing.set()  # ends a redelivery pause and stops between chunks
        batch = self._batch
        parts = [b.work for b in self.builds if b.work is not None and not b.work.done()]
        try:
            budget = self.config.close_budget_s
            for work in [batch, *parts]:
                if work is None or work.done():
                    continue
                try:
                    await asyncio.wait_for(asyncio.shield(work), budget)
                except Exception as exc:
                    log.warning("%s: batch did not finish in %.0fs: %r", self.name, budget, exc)
        finally:  # a close cancelled itself (a listener's budget) still closes the stores
            for build in self.builds:
                await build.stop()
            running = [t for t in (self._opening, batch, *parts) if t is not None and not t.done()]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            resumes = resume_points(self.lanes, self.port.absolute)  # read before release
            await self.state.release()
        log.info("closed %s: %s", self.name, resumes)

    def mark_lost(self, exc: BaseException) -> None:
        if self.phase in (Phase.LOST, Phase.FAILED):
            return  # told already (a failure stands)
        self.transition_if_open(Phase.LOST)  # fenced work that raced the close
        then = "it stays paused until the group rebalances (asked for while still assigned)"
        log.error("%s: another worker took the partition over (%r); %s", self.name, exc, then)

    # live deliveries -----------------------------------------------------------------
    def feed(self, deliveries: Sequence[Delivery], *, prefetch: bool = False) -> None:
        """Take fetched deliveries: process them in the background. The partition is
        paused meanwhile; with ``prefetch`` (a source that can fetch ahead: Kafka) it is
        fetched on while the batch runs and commits, and what arrives meanwhile
        (``ahead.add``) is the next batch (:mod:`~streamapp.engine.ahead`)."""
        start = self.next_position or 0
        if deliveries and deliveries[0].position < start:  # already applied (a seek raced)
            deliveries = [d for d in deliveries if d.position >= start]
        if not deliveries:
            return
        self.set_live_state(LiveState.HANDLING, was=LiveState.IDLE)
        self.ahead.start(prefetch, deliveries)
        self._batch = asyncio.create_task(self.process(deliveries), name=f"batch {self.name}")
        self._batch.add_done_callback(self._batch_done)

    @property
    def queueing(self) -> bool:
        """True while deliveries fetched ahead are taken (``ahead.add``)."""
        return self.ahead.taking and self.phase is Phase.LIVE

    def hold_ahead(self) -> None:
        """Take nothing more ahead; what was dropped is fetched again after a rewind."""
        if self.ahead.hold():
            self._reseek = True

    def recheck(self) -> None:
        """The source may have changed hands (a queue's single active consumer, after an
        open or a reconnect): replay what another consumer may have taken and acked,
        stored below the next live batch's first store position, before that batch."""
        self.replay.recheck()

    def dropped(self) -> None:
        """Deliveries arrived while not accepting: rewind before resuming."""
        self._reseek = True

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.fail(exc, f"{self.name}: batch task died: {exc!r}")

    async def process(self, deliveries: Sequence[Delivery]) -> None:
        """Run live ``deliveries`` (in order) through the agents, commit, then resume;
        then what was fetched meanwhile, if anything (see :meth:`feed`; a caller that
        does not feed, the memory broker, makes the task handle them here)."""
        if self.live_state is LiveState.IDLE and self.phase is Phase.LIVE:
            self.set_live_state(LiveState.HANDLING, was=LiveState.IDLE)
        while True:
            wait_s = await self._process(deliveries)
            if wait_s is None:
                self.hold_ahead()
                return
            if wait_s or not self.ahead_waiting or self.joining or self.damaged:
                break
            if self.phase is not Phase.LIVE or self.reseek:
                break
            deliveries = self.ahead.take()
        stopped = self.phase is not Phase.LIVE  # lost, failed or closed: stays paused
        if wait_s or self.ahead_waiting or self.joining or self.damaged or stopped:
            self.hold_ahead()
        self.ahead.taking = False
        if self.damaged:
            async with self.turn:
                rebuilt = await rebuild_damaged(self)
            if not rebuilt:
                return
        await self.pauses.wait(self.closing, wait_s)
        if self.phase is not Phase.LIVE:
            return
        if self.reseek and self.next_position is not None:
            self.rewind(self.next_position)
        self.set_live_state(LiveState.IDLE, was=LiveState.HANDLING)
        self.ahead.resumed()
        self.port.resume()

    async def _process(self, deliveries: Sequence[Delivery]) -> float | None:
        """One live batch: run, commit; the pause before the next (None: stop)."""
        try:
            if self.replay.check_gap:
                self.replay.check_gap = False
                await self.replay.close_gap(deliveries)
            async with self.turn:
                return await self._run_batch(deliveries)
        except FencedError as exc:
            self.mark_lost(exc)
            return None
        except Exception as exc:
            self.hold_ahead()
            if isinstance(exc, StoreCorruptError) and self.state.damaged:
                return 0.0  # rebuilt by the caller; the batch runs again after it
            log.error("%s: batch failed, rewinding to %s: %r", self.name, self.next_position, exc)
            async with self.turn:
                recovered = await self.recover()
            if not recovered:
                return None
            return self.config.redeliver_pause_s

    async def _run_batch(self, deliveries: Sequence[Delivery]) -> float | None:
        """Run and commit live ``deliveries`` in chunks; the pause before the partition
        is fetched again (None: the task stops taking deliveries)."""
        config, wait_s = self.config, 0.0
        size = config.max_batch_records
        for i in range(0, len(deliveries), size):
            if self.phase is not Phase.LIVE:  # closed: the next owner starts at our checkpoint
                return None
            chunk = deliveries[i : i + size]
            starts = [SKIP if lane.next is None else lane.next for lane in self.lanes]
            run = await run_lanes(
                self.lanes, starts, chunk, self._decode, config.batch_budget_s, metrics=self.metrics
            )
            if run.reached != starts:
                last = i + size >= len(deliveries)
                await self._commit_live(chunk, run, whole=last and run.stop is None)
            if run.refused is not None:
                self.refuse(run.refused)
                return None
            if run.stop is not None:
                self.rewind(min(run.reached))
                wait_s = run.pause_s(self.metrics, self.config.redeliver_pause_s)
                self.pauses.chose(wait_s)
                break
        return wait_s

    def refuse(self, reason: str) -> None:
        """An agent refused a delivery: what came before it is committed, it is not."""
        self.fail(AgentRefusedError(reason), f"{self.name}: {reason}")

    async def _commit_live(self, chunk: Sequence[Delivery], run: Run, *, whole: bool) -> None:
        """Commit ``chunk``'s run; ``whole``: it ran to the end of what the source handed
        out, so the settle may move past what the transport skipped after it."""
        before = self.next_position or 0
        for lane, reached in zip(self.lanes, run.reached, strict=True):
            if reached != SKIP:
                lane.next = reached
        settle = min(run.reached)
        live = [lane for lane in self.lanes if lane.next is not None]  # not building
        if whole and not self._fetched_on() and all(lane.next == settle for lane in live):
            through = await self.port.through(settle)
            if not self._fetched_on():  # nothing fetched meanwhile that the task did not run
                settle = through
                for lane in live:
                    lane.next = settle
        stored = {
            lane: store_position([d for d in chunk if d.position < (lane.next or 0)])
            for lane in self.lanes
            if lane.tracks
        }

        def advanced(lane: Lane, cp: Checkpoint) -> Checkpoint:
            if lane.building:
                return cp  # its replay commits its positions
            cp = cp.advanced(live=lane.next)
            position = stored.get(lane)
            if position is not None and position >= (cp.history or 1):
                cp = cp.advanced(history=position + 1)
            return cp

        await self.commit(settle, advanced)
        for lane in self.lanes:
            lane.committed = lane.next
            if lane.next is not None:
                lane.attempts.settled(lane.next)
        self._next = settle
        self.counts.processed += sum(1 for d in chunk if before <= d.position < settle)

    def _fetched_on(self) -> bool:
        """Deliveries past the chunk in hand were fetched (waiting, or dropped)."""
        return self.reseek or self.ahead_waiting

    def rewind(self, position: int) -> None:
        self.hold_ahead()  # what was fetched ahead is fetched again from ``position``
        self.port.rewind(position)
        self._reseek = False

    # the commit order (engine/commit.py) -----------------------------------------------
    async def commit(
        self, settle_at: int | None, checkpoint: Callable[[Lane, Checkpoint], Checkpoint]
    ) -> None:
        """Commit every lane's open batch (see :class:`~streamapp.engine.commit.Commit`)."""
        try:
            await self.committer(settle_at, checkpoint)
        except StoreBehindError as exc:
            self.fail(exc, f"{self.name}: {exc}; its stores are restored from the changelogs")
            raise

    async def recover(self) -> bool:
        """After a failed commit: back to the durable state (:func:`~.recover.recover`)."""
        return await recover(self)
