"""The partition task: the life of one source partition, the same for every transport.

Between assignment and revocation the task opens the partition's stores, restores them
from their changelogs, replays the event store when an agent has a history (catch-up),
hands over to live deliveries, runs batches through every agent of the topic (each a
lane, :mod:`streamapp.engine.lane`), commits them in the one documented order
(:mod:`streamapp.engine.commit`), rewinds with back-off when a commit fails, and parks
what a policy parks. The transport only gives it a
:class:`~streamapp.engine.port.PartitionPort` and, where batches must survive a move
atomically, a :class:`~streamapp.engine.port.Transaction`; where there is none, derived
events go out through ``publish`` (confirmed) before the store write and the settle.

While the task works (a batch, a restore, a catch-up), its partition is paused at the
source, so the transport's poll loop keeps polling (heartbeats, other partitions).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import structured
from ..agent import Agent
from ..errors import (
    ConfigError,
    FencedError,
    StoreFormatError,
    StreamappError,
    TableUnavailableError,
)
from ..events import Event
from ..outcomes import FailurePolicy, Outcome, Redeliver, Retry
from ..outputs import Encoder
from ..settings import Settings
from ..tables.checkpoint import Checkpoint
from ..tables.partition import PartitionTables, spaces_for
from ..tables.reads import Locator, ReadView
from ..tables.store import Store
from ..tables.table import Table
from .attempts import Attempts
from .commit import Commit, Publish, StoreBehindError
from .delivery import STORE_POSITION_HEADER, Decoder, Delivery, Parker
from .lane import SKIP, Lane, Run, run_lanes
from .metrics import NO_METRICS, TaskMetrics
from .pace import Pace, pause
from .phase import Phase
from .port import Committed, PartitionPort, Transaction

log = logging.getLogger("streamapp.partition")

StoreOpener = Callable[[Agent, list[str]], Store]
"""Opens an agent's store of the partition with these spaces (blocking: in a thread)."""
ParkerFor = Callable[[Agent], Parker]
"""The Parker of an agent in this partition."""
Fatal = Callable[[BaseException], None]
"""Told when a partition cannot go on in this worker (an agent refused, a store behind
its changelog, a store or an app that cannot open): the source fails, the worker stops
and leaves, and another worker takes the partition over from its last commit."""


class AgentRefusedError(StreamappError):
    """An agent raised :class:`~streamapp.Refuse`: the worker stops (see :data:`Fatal`)."""


class HistoryFeed(Protocol):
    """Replays the event store into tasks that catch up (one reader per worker)."""

    async def catch_up(self, task: PartitionTask) -> None:
        """Return once ``task``'s tables hold every stored event of its partition up to
        the store's head (the feed calls :meth:`PartitionTask.apply_history`)."""

    async def live_start(self, task: PartitionTask) -> int | None:
        """Where the live source should start after the handover (None: unknown)."""
        ...


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """The settings a task reads (see :class:`~streamapp.settings.Settings`)."""

    max_batch_records: int = 2000
    batch_budget_s: float = 10.0
    redeliver_pause_s: float = 0.5
    redeliver_backoff_max_s: float = 30.0
    """Pauses before redeliveries of one delivery double up to this."""
    close_budget_s: float = 30.0
    policy_pauses: bool = True
    """Honour ``Redeliver(pause_s=...)`` and ``Retry(intervals=...)``; the memory broker
    retries at once instead."""
    delayed_policy: str = "immediate"
    """What ``send(..., delay_s=...)`` does (setting ``delayed_policy``)."""
    clock: Callable[[], float] = time.time
    """Seconds since the epoch: when retry copies are due (the memory broker's runs
    ahead through back-offs)."""
    replay_on_open: bool = False
    """Replay the event store from the checkpoint's store position at every open, caught
    up or not: RabbitMQ keeps no changelog, so a partition that was away may have been
    applied by another worker meanwhile (live deliveries carrying their store position,
    :data:`STORE_POSITION_HEADER`, keep that replay short)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> TaskConfig:
        return cls(
            max_batch_records=settings.max_batch_records,
            batch_budget_s=settings.batch_budget_ms / 1000,
            redeliver_pause_s=settings.poll_timeout_ms / 1000,
            redeliver_backoff_max_s=settings.redeliver_backoff_max_ms / 1000,
            close_budget_s=settings.rebalance_timeout_ms / 2000,
            delayed_policy=settings.delayed_policy,
        )

    def first_pause_s(self, policy: FailurePolicy) -> float:
        """The pause before the first redelivery under ``policy``."""
        if isinstance(policy, Redeliver) and policy.pause_s is not None and self.policy_pauses:
            return policy.pause_s
        return self.redeliver_pause_s


def _unplugged(table: Table[Any], partition: int) -> Store:
    raise TableUnavailableError(f"table {table.name!r}: this transport serves no table reads")


class PartitionTask:
    """Processes one partition of one source topic through every agent of the topic."""

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        partition: int,
        port: PartitionPort,
        *,
        name: str,
        config: TaskConfig,
        decode: Decoder,
        park: ParkerFor,
        open_store: StoreOpener | None = None,
        transaction: Transaction | None = None,
        history: HistoryFeed | None = None,
        metrics: TaskMetrics = NO_METRICS,
        encode: Encoder | None = None,
        publish: Publish | None = None,
        locate: Locator = _unplugged,
        on_fatal: Fatal | None = None,
    ) -> None:
        agents = [agents] if isinstance(agents, Agent) else list(agents)
        if not agents or len({a.topic for a in agents}) != 1:
            raise ConfigError(f"{name}: a partition task runs the agents of one topic")
        senders = [a.name for a in agents if a.sinks]
        if senders and ((transaction is None and publish is None) or encode is None):
            raise ConfigError(
                f"{name}: agent(s) {senders} send derived events, but this source has no "
                "broker to send them to"
            )
        chained = [a.name for a in agents if isinstance(a.on_failure, Retry)]
        if chained and transaction is None and publish is None:
            raise ConfigError(
                f"{name}: agent(s) {chained} use on_failure=Retry(...), but this source has "
                "no broker for the retry and dead-letter topics: run the app on kafka or rabbitmq"
            )
        self.topic = agents[0].topic
        self.partition, self.port, self.name = partition, port, name
        self.config, self._decode = config, decode
        self.metrics = metrics
        self._open_store, self.transaction, self.history = open_store, transaction, history
        self._locate, self._on_fatal = locate, on_fatal
        self.fatal: BaseException | None = None
        """Why this partition stopped for good here (see :data:`Fatal`)."""
        self.lanes = [
            Lane(
                a,
                park(a),
                Attempts(config.first_pause_s(a.on_failure), config.redeliver_backoff_max_s),
                encode,
            )
            for a in agents
        ]
        self._closing = asyncio.Event()
        for lane in self.lanes:
            lane.tracks = config.replay_on_open and lane.agent.history is not None
            lane.configure(
                self._closing,
                waits=config.policy_pauses,
                clock=config.clock,
                delayed=config.delayed_policy,
            )
        self._committer = Commit(self.lanes, port, transaction, publish, metrics)
        self.phase = Phase.RESTORING
        self.busy = False
        self.next_position: int | None = None
        self.start_position: int | None = None
        self.processed = 0
        self.restored = 0
        self.replayed = 0
        self._check_gap = False
        """Before the next live batch, replay what the store holds below its first store
        position (see :meth:`recheck`)."""
        self.follows_store = False
        """True when the event store is this task's live source (STREAMAPP_BROKER=none)."""
        self._replaying: list[Lane] = []
        """The lanes the event store feeds: catching up, or following the store."""
        self._opening: asyncio.Task[None] | None = None
        self._batch: asyncio.Future[Any] | None = None
        self._reseek = False

    # the first lane, for the common one-agent topic ------------------------------------
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
        out: dict[Outcome, int] = {}
        for lane in self.lanes:
            for outcome, n in lane.outcomes.items():
                out[outcome] = out.get(outcome, 0) + n
        return out

    @property
    def unversioned(self) -> int:
        """Events applied to tables without ``streamversion`` (at least once), all agents."""
        return sum(lane.unversioned for lane in self.lanes)

    def tables_for(self, table: str) -> PartitionTables | None:
        """The tables (of this partition) of the agent that owns ``table``, once open."""
        for lane in self.lanes:
            if lane.tables is not None and any(t.name == table for t in lane.agent.tables):
                return lane.tables
        return None

    # lifecycle -------------------------------------------------------------------
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
        finish the batch in hand (it commits) and keep stores and transaction open.
        False when the task cannot be kept (not live, or its batch did not finish): the
        caller closes it then. A kept task takes no deliveries until :meth:`rejoin`."""
        if self.phase is not Phase.LIVE:
            return False
        self.busy = True  # nothing is fed while suspended
        batch = self._batch
        if batch is not None and not batch.done():
            try:
                await asyncio.wait_for(asyncio.shield(batch), self.config.close_budget_s)
            except Exception as exc:
                log.warning("%s: batch did not finish on revoke (%r): closed", self.name, exc)
                return False
        return self.phase is Phase.LIVE

    def rejoin(self) -> None:
        """The partition came back after :meth:`suspend`: in the background, fence and
        catch up with whatever another owner committed meanwhile, then take deliveries
        again, with no store reopen and no restore when nothing changed."""
        self.port.pause()
        self._opening = asyncio.create_task(self._rejoin(), name=f"rejoin {self.name}")
        self._opening.add_done_callback(self._opening_done)

    async def _rejoin(self) -> None:
        try:
            if self.transaction is not None:
                # Another worker may have held the partition between the revoke and now
                # (this one out of the group meanwhile): the reset fences it, and its
                # committed batches are restored from the changelogs.
                await self.transaction.reset()
                await self._restore_tail()
            else:  # no tables, no sends: the group's committed offset is the position
                start = await self.port.begin(None, stateful=False)
                for lane in self.lanes:
                    lane.next = lane.committed = start
                self.next_position = start
        except asyncio.CancelledError:
            raise
        except FencedError as exc:
            self._lost(exc)
            return
        except Exception as exc:
            log.warning("%s: kept open, but cannot go on (%r): opened again", self.name, exc)
            await self._release()
            self.phase = Phase.RESTORING
            await self.open()
            return
        if self._closing.is_set() or self.phase is not Phase.LIVE:
            return
        if self.next_position is not None:
            self._rewind(self.next_position)
        self.busy = False
        self.port.resume()
        log.info("live %s again at position %s (kept open)", self.name, self.next_position)

    def _opening_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._fail(exc, f"{self.name}: cannot open: {exc}")

    def _fail(self, exc: BaseException, message: str) -> None:
        """Stop this partition for good here: logged once, and the source is told, so the
        worker stops and leaves the group (the partition stays paused meanwhile)."""
        self.phase = Phase.LOST
        if self.fatal is not None:
            return
        self.fatal = exc
        if self._on_fatal is None:
            log.error("%s; the partition stays paused", message)
            return
        log.error("%s; the worker stops so that another one takes the partition over", message)
        self._on_fatal(exc)

    async def open(self) -> None:
        """Open, restore, catch up and go live, retrying with back-off: a partition is
        never left paused without an owner task (a lock still held, a broker hiccup)."""
        pace = Pace(self._closing)
        while self.phase in (Phase.RESTORING, Phase.CATCHING_UP):
            try:
                await self._open_tables()
                await self._catch_up()
                await self._go_live()
                return
            except asyncio.CancelledError:
                raise
            except FencedError as exc:
                self._lost(exc)
                return
            except (ConfigError, StoreFormatError):
                raise  # no retry helps: the opening task reports it and the partition is lost
            except Exception as exc:
                log.error("%s: opening failed (%r); retrying in %.1fs", self.name, exc, pace.delay)
                await self._release()
                if self._closing.is_set():
                    return
                self.phase = Phase.RESTORING
                await pace.wait()

    async def close(self) -> None:
        """Finish the batch in hand (it commits), then close the transaction and stores."""
        self.phase = Phase.CLOSED
        self._closing.set()  # ends a redelivery pause and stops between chunks
        batch = self._batch
        try:
            if batch is not None and not batch.done():
                budget = self.config.close_budget_s
                try:
                    await asyncio.wait_for(asyncio.shield(batch), budget)
                except Exception as exc:
                    log.warning("%s: batch did not finish in %.0fs: %r", self.name, budget, exc)
        finally:  # a close cancelled itself (a listener's budget) still closes the stores
            running = [t for t in (self._opening, batch) if t is not None and not t.done()]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self._release()
        log.info("closed %s at position %s", self.name, self.next_position)

    async def _release(self) -> None:
        """Close the transaction and the stores, whatever fails on the way."""
        stores = [lane.tables.store for lane in self.lanes if lane.tables is not None]
        for lane in self.lanes:
            lane.tables, lane.views = None, []
        try:
            if self.transaction is not None:
                await self.transaction.close()
        except Exception as exc:
            log.warning("%s: closing the transaction failed: %r", self.name, exc)
        finally:
            for store in stores:
                store.close()

    def _lost(self, exc: BaseException) -> None:
        self.phase = Phase.LOST
        log.error(
            "%s: another worker took the partition over (%r); this worker no longer owns it "
            "and leaves it paused until the group revokes it",
            self.name,
            exc,
        )

    # opening -----------------------------------------------------------------------
    async def _open_tables(self) -> None:
        for lane in self.lanes:
            if lane.agent.tables and self._open_store is not None:
                lane.tables = await self._open_one(lane.agent, self._open_store)
        if self.transaction is not None:
            await self.transaction.open()  # fences the previous owner first
            for lane in self.lanes:
                if lane.tables is not None:
                    restored = await self.transaction.restore(lane.agent, lane.tables)
                    self.restored += restored
                    self.metrics.restored(lane.name, restored)
        for lane in self.lanes:
            lane.views = [self._view(lane, table) for table in lane.agent.views]

    async def _open_one(self, agent: Agent, opener: StoreOpener) -> PartitionTables:
        spaces = spaces_for(agent.tables)
        opening = asyncio.ensure_future(asyncio.to_thread(opener, agent, spaces))
        try:  # the open may wait for a previous owner's lock: off the loop
            store = await asyncio.shield(opening)
        except asyncio.CancelledError:  # closed meanwhile: close the store once open
            opening.add_done_callback(_close_when_opened)
            raise
        try:
            where = self.name if len(self.lanes) == 1 else f"{self.name} of agent {agent.name}"
            return PartitionTables(
                agent.tables, store, self.partition, self.topic.partitions, where=where
            )
        except BaseException:
            store.close()
            raise

    def _view(self, lane: Lane, table: Table[Any]) -> Any:
        if lane.tables is not None and table in lane.agent.tables:
            return lane.tables.view(table.name)
        sibling = any(table in other.agent.tables for other in self.lanes)
        locate = self._sibling_store if sibling else self._locate
        return ReadView(table, self.partition, self.topic.partitions, locate)

    def _sibling_store(self, table: Table[Any], partition: int) -> Store:
        """The committed store of a table another agent of this task writes (in any
        phase: this task's own replay may read it)."""
        tables = self.tables_for(table.name)
        if tables is None:
            raise TableUnavailableError(f"table {table.name!r} partition {partition} is closed")
        return tables.store

    async def _catch_up(self) -> None:
        replay_all = self.config.replay_on_open
        lanes = [
            lane
            for lane in self.lanes
            if lane.agent.history is not None
            and lane.tables is not None
            and (replay_all or not lane.tables.checkpoint.caught_up)
        ]
        if not lanes:
            return
        if self.history is None:
            raise ConfigError(
                f"agent {lanes[0].name!r} declares a history, but this worker has no "
                "event store feed for it (setting event_store)"
            )
        self._replaying = lanes
        self.phase = Phase.CATCHING_UP
        await self.history.catch_up(self)
        if self.phase is not Phase.CATCHING_UP:
            return
        done = {lane: lane.history_position() for lane in lanes}
        await self._commit(None, _history_at(done, caught_up=True))
        log.info("%s caught up at store position %s", self.name, min(done.values()))

    async def _go_live(self) -> None:
        """Start live delivery where the lanes' state stands (the lowest of their
        positions), then resume the partition."""
        if self.phase not in (Phase.RESTORING, Phase.CATCHING_UP):
            return
        known, unknown, durable = await self._positions()
        if unknown and known and not self.port.absolute:
            # Positions count deliveries from begin() on: every lane starts with the others.
            # A new table without history has nothing to start from: the port may refuse.
            fresh = any(lane.tables is not None and lane.agent.history is None for lane in unknown)
            start = await self.port.begin(None if fresh else min(known.values()), stateful=True)
            known = (
                dict.fromkeys(self.lanes, start) if fresh else dict.fromkeys(unknown, start) | known
            )
        elif unknown:
            stateful = any(lane.tables is not None for lane in unknown)
            from_history = any(lane.agent.history is not None for lane in unknown if lane.tables)
            start = await self.port.begin(None, stateful=stateful, earliest=from_history)
            known.update(dict.fromkeys(unknown, start))
            low = min(known.values())
            if low < start:
                self.port.rewind(low)
            start = low
        else:
            start = await self.port.begin(min(known.values()), stateful=True)
        if self._closing.is_set():  # closed while the source began: stay closed
            return
        if not self.port.absolute:
            # Positions count this session's deliveries: a lane's position from an earlier
            # session says nothing of this one's (the version guard skips what it applied).
            known = dict.fromkeys(self.lanes, start)
        self._replaying = list(self.lanes) if self.follows_store else []
        for lane in self.lanes:
            lane.next = lane.committed = known[lane]
        self.next_position = self.start_position = start
        self._reseek = False
        self._check_gap = any(lane.tracks for lane in self.lanes)
        if durable:  # the group may be behind the tables (a replay, an older streamapp)
            await self.port.settle(start, self._committer.ahead(start))
        self.phase = Phase.LIVE
        self.port.resume()
        log.info("live %s at position %d", self.name, start)

    async def _positions(self) -> tuple[dict[Lane, int], list[Lane], bool]:
        """Each lane's live position where known, the lanes the transport must place,
        and whether a position is durable in a table (its checkpoint, or the replay)."""
        known: dict[Lane, int] = {}
        unknown: list[Lane] = []
        durable = False
        committed: Committed | None = None
        stateless = any(lane.tables is None for lane in self.lanes)
        if stateless and (len(self.lanes) > 1 or self.transaction is not None):
            # Read after the fence (open): the previous owner's transaction is settled.
            committed = await self.port.committed()
        history_start: int | None = None
        for lane in self.lanes:
            tables = lane.tables
            if tables is None:
                if committed is not None:
                    known[lane] = committed.ahead.get(lane.name, committed.position)
                else:
                    unknown.append(lane)
                continue
            position = tables.checkpoint.live
            if position is not None:
                known[lane], durable = position, True
                continue
            if lane.agent.history is not None and self.history is not None:
                if history_start is None:
                    history_start = await self.history.live_start(self)
                if history_start is not None:
                    known[lane], durable = history_start, True  # the replay holds the rest
                    continue
            unknown.append(lane)
        return known, unknown, durable

    # live deliveries -----------------------------------------------------------------
    def feed(self, deliveries: Sequence[Delivery]) -> None:
        """Take fetched deliveries: process them in the background, partition paused."""
        start = self.next_position or 0
        if deliveries and deliveries[0].position < start:  # already applied (a seek raced)
            deliveries = [d for d in deliveries if d.position >= start]
        if not deliveries:
            return
        self.busy = True
        self.port.pause()
        self._batch = asyncio.create_task(self.process(deliveries), name=f"batch {self.name}")
        self._batch.add_done_callback(self._batch_done)

    def recheck(self) -> None:
        """The source may have changed hands under this task (a queue with single active
        consumer, after an open or a reconnect): before the next live batch, events of
        this partition stored below that batch's first store position, which another
        consumer may have taken and acked, are replayed from the store."""
        self._check_gap = any(lane.tracks for lane in self.lanes)

    async def _close_gap(self, deliveries: Sequence[Delivery]) -> None:
        lanes = [lane for lane in self.lanes if lane.tracks and lane.tables is not None]
        first = _store_position(deliveries[:1])
        if not lanes or first is None or self.history is None:
            return
        if first <= min(lane.history_position() for lane in lanes):
            return
        before = self.outcomes.get(Outcome.DELIVERED, 0)
        self._replaying = lanes
        self.phase = Phase.CATCHING_UP
        replay = asyncio.ensure_future(self.history.catch_up(self))
        closing = asyncio.ensure_future(self._closing.wait())
        await asyncio.wait({replay, closing}, return_when=asyncio.FIRST_COMPLETED)
        for waiting in (replay, closing):  # a close ends the wait (the feed drops it)
            if not waiting.done():
                waiting.cancel()
        await asyncio.gather(replay, closing, return_exceptions=True)
        if self.phase is not Phase.CATCHING_UP or self._closing.is_set():
            return
        done = {lane: lane.history_position() for lane in lanes}
        await self._commit(None, _history_at(done))
        self._replaying = []
        self.phase = Phase.LIVE
        applied = self.outcomes.get(Outcome.DELIVERED, 0) - before
        if applied:
            log.info(
                "%s: the first live event is at store position %d, beyond this partition's "
                "own: replayed the store up to its head first (%d applied; some may have "
                "been taken from the queue by another consumer)",
                self.name,
                first,
                applied,
            )

    def dropped(self) -> None:
        """Deliveries arrived while not accepting: rewind before resuming."""
        self._reseek = True

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._fail(exc, f"{self.name}: batch task died: {exc!r}")

    async def process(self, deliveries: Sequence[Delivery]) -> None:
        """Run live ``deliveries`` (in order) through the agents, commit, then resume."""
        config = self.config
        wait_s = 0.0
        try:
            if self._check_gap:
                self._check_gap = False
                await self._close_gap(deliveries)
            size = config.max_batch_records
            for i in range(0, len(deliveries), size):
                if self.phase is not Phase.LIVE:  # closed: the next owner starts at our checkpoint
                    return
                chunk = deliveries[i : i + size]
                starts = [SKIP if lane.next is None else lane.next for lane in self.lanes]
                run = await run_lanes(
                    self.lanes,
                    starts,
                    chunk,
                    self._decode,
                    config.batch_budget_s,
                    metrics=self.metrics,
                )
                if run.reached != starts:
                    last = i + size >= len(deliveries)
                    await self._commit_live(chunk, run, whole=last and run.stop is None)
                if run.refused is not None:
                    self._refused(run.refused)
                    return
                if run.stop is not None:
                    self._rewind(min(run.reached))
                    wait_s = self._wait_after(run)
                    break
        except FencedError as exc:
            self._lost(exc)
            return
        except Exception as exc:
            log.error("%s: batch failed, rewinding to %s: %r", self.name, self.next_position, exc)
            if not await self._recover():
                return
            wait_s = config.redeliver_pause_s
        await pause(self._closing, wait_s)
        if self.phase is not Phase.LIVE:
            return
        if self._reseek and self.next_position is not None:
            self._rewind(self.next_position)
        self.busy = False
        self.port.resume()

    def _refused(self, reason: str) -> None:
        """An agent refused a delivery: what came before it is committed, it is not."""
        self._fail(AgentRefusedError(reason), f"{self.name}: {reason}")

    def _wait_after(self, run: Run) -> float:
        """The pause before the partition is fetched again after ``run`` stopped."""
        for lane in run.failed:
            self.metrics.redelivery(lane.name)
        if run.failed:
            return max(lane.attempts.pause_s() for lane in run.failed)
        return self.config.redeliver_pause_s if run.unavailable else 0.0

    def retry_pause_s(self) -> float:
        """The pause before a failed delivery is tried again (the longest of the lanes
        failing at it)."""
        failing = [lane.attempts.pause_s() for lane in self.lanes if lane.attempts.failed]
        return max(failing, default=self.config.redeliver_pause_s)

    async def _commit_live(self, chunk: Sequence[Delivery], run: Run, *, whole: bool) -> None:
        """Commit ``chunk``'s run; ``whole``: it ran to the end of what the source handed
        out, so the settle may move past what the transport skipped after it."""
        before = self.next_position or 0
        for lane, reached in zip(self.lanes, run.reached, strict=True):
            if reached != SKIP:
                lane.next = reached
        settle = min(run.reached)
        if whole and not self._reseek and all(lane.next == settle for lane in self.lanes):
            through = await self.port.through(settle)
            if not self._reseek:  # nothing fetched meanwhile that the task did not run
                settle = through
                for lane in self.lanes:
                    lane.next = settle
        stored = {
            lane: _store_position([d for d in chunk if d.position < (lane.next or 0)])
            for lane in self.lanes
            if lane.tracks
        }

        def live(lane: Lane, cp: Checkpoint) -> Checkpoint:
            cp = cp.advanced(live=lane.next)
            position = stored.get(lane)
            if position is not None and position >= (cp.history or 1):
                cp = cp.advanced(history=position + 1)
            return cp

        await self._commit(settle, live)
        for lane in self.lanes:
            lane.committed = lane.next
            if lane.next is not None:
                lane.attempts.settled(lane.next)
        self.next_position = settle
        self.processed += sum(1 for d in chunk if before <= d.position < settle)

    def _rewind(self, position: int) -> None:
        self.port.rewind(position)
        self._reseek = False

    # event-store history -----------------------------------------------------------
    def history_position(self) -> int:
        """The next event-store position this partition needs (1: nothing replayed)."""
        lanes = self._replaying or self.lanes
        return min(lane.history_position() for lane in lanes)

    def start_following(self, head: int) -> None:
        """The event store is the live source from now on (``STREAMAPP_BROKER=none``):
        agents without tables start after ``head``, the others at their checkpoint."""
        self.follows_store = True
        for lane in self.lanes:
            if lane.tables is None:
                lane.history_next = head + 1

    async def apply_history(self, deliveries: Sequence[Delivery], next_position: int) -> bool:
        """Apply stored events of this partition, read up to ``next_position`` (exclusive),
        and commit with the store position. False when an event failed under Redeliver:
        the position stops before it, and the feed tries again after
        :meth:`retry_pause_s`; once a bounded Redeliver's attempts are spent, its
        fallback applies as to live deliveries."""
        live_from_store = self.phase is Phase.LIVE and self.follows_store
        if self.phase is not Phase.CATCHING_UP and not live_from_store:
            return False  # handed over (or closed): the live source feeds it now
        work = asyncio.ensure_future(self._apply_history(deliveries, next_position))
        self._batch = work
        try:
            ok = await asyncio.shield(work)
        except FencedError as exc:
            self._lost(exc)
            return False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the feed itself is stopping
            return False  # close() gave up on this chunk: the checkpoint holds
        except Exception as exc:  # a failed commit: the checkpoint still holds
            log.error("%s: replayed batch failed (%r); it is read again", self.name, exc)
            await self._recover()
            return False
        return ok

    async def _apply_history(self, deliveries: Sequence[Delivery], next_position: int) -> bool:
        """Commits in parts of at most ``batch_budget_s`` each, as live batches do: a slow
        handler never holds a whole store chunk (up to 10,000 events) uncommitted."""
        lanes = self._replaying or self.lanes
        if not deliveries:  # nothing of this partition: advance without a commit
            for lane in lanes:
                lane.history_next = max(lane.history_next, next_position)
            return True
        budget = self.config.batch_budget_s
        while True:
            starts = [lane.history_position() if lane in lanes else SKIP for lane in self.lanes]
            run = await run_lanes(
                self.lanes, starts, deliveries, decode_stored, budget, metrics=self.metrics
            )
            done = {
                lane: max(lane.history_position(), next_position if run.stop is None else reached)
                for lane, reached in zip(self.lanes, run.reached, strict=True)
                if lane in lanes
            }
            if run.stop is None or run.reached != starts:
                await self._commit(None, _history_at(done))
                for lane, position in done.items():
                    lane.history_next = max(lane.history_next, position)
                    lane.attempts.settled(position)
            low = min(done.values())
            settled = sum(1 for d in deliveries if d.position < low)
            self.replayed += settled
            for lane in lanes:
                self.metrics.replayed(lane.name, settled)
            for lane in run.failed:
                self.metrics.redelivery(lane.name)
            if run.refused is not None:
                self._refused(run.refused)
                return False
            if run.stop is None:
                return True
            if not run.cut or self._closing.is_set():
                return False
            deliveries = [d for d in deliveries if d.position >= low]  # out of budget: go on

    # the commit order (engine/commit.py) -----------------------------------------------
    async def _commit(
        self, settle_at: int | None, checkpoint: Callable[[Lane, Checkpoint], Checkpoint]
    ) -> None:
        """Commit every lane's open batch (see :class:`~streamapp.engine.commit.Commit`)."""
        try:
            await self._committer(settle_at, checkpoint)
        except StoreBehindError as exc:
            self._fail(exc, f"{self.name}: {exc}; its stores are restored from the changelogs")
            raise

    async def _recover(self) -> bool:
        """After a failed commit: drop the batch, reset the transaction, rewind to the
        checkpoint. Retries with back-off while the partition is ours.

        A transaction that timed out may still have committed. The reset fences it (it is
        then committed or aborted for good) and the changelogs' committed tail is restored
        into the stores, as a new owner would: a batch that committed after all is in the
        stores and checkpoints then, and is not run again (its derived events and copies
        would go out twice)."""
        pace = Pace(self._closing)
        while self.phase in (Phase.LIVE, Phase.CATCHING_UP):
            try:
                for lane in self.lanes:
                    lane.drop()
                if self.transaction is not None:
                    await self.transaction.reset()
                    await self._restore_tail()
                if self.next_position is not None and self.phase is Phase.LIVE:
                    self._rewind(self.next_position)
                return True
            except FencedError as exc:
                self._lost(exc)
                return False
            except Exception as exc:
                log.error("%s: rewind failed (%r); retrying in %.1fs", self.name, exc, pace.delay)
                await pace.wait()
        return False

    async def _restore_tail(self) -> None:
        """Restore what the changelogs committed beyond the stores, and move live lanes to
        the positions that makes durable (see :meth:`_recover`)."""
        assert self.transaction is not None
        restored = 0
        for lane in self.lanes:
            if lane.tables is not None:
                restored += await self.transaction.restore(lane.agent, lane.tables)
        if restored:
            log.warning(
                "%s: the failed transaction committed after all: %d changelog records "
                "restored; its batch is not run again",
                self.name,
                restored,
            )
        if self.phase is not Phase.LIVE or self.next_position is None:
            return  # a replay reads the restored checkpoints' store positions
        known, _, _ = await self._positions()
        for lane in self.lanes:
            position = known.get(lane)
            if position is not None and (lane.committed is None or position > lane.committed):
                lane.next = lane.committed = position
        held = [lane.committed for lane in self.lanes if lane.committed is not None]
        if held:
            self.next_position = max(self.next_position, min(held))

    @property
    def lag(self) -> int | None:
        """Live deliveries of this partition not yet committed, when the transport knows
        the partition's end cheaply (None: unknown, or not live yet)."""
        end = self.port.end()
        if end is None or self.next_position is None:
            return None
        return max(end - self.next_position, 0)

    def table_sizes(self) -> dict[str, int]:
        """Keys per table of this partition, where the store knows cheaply."""
        out = {}
        for lane in self.lanes:
            tables = lane.tables
            if tables is None:
                continue
            for table in tables.tables:
                n = tables.store.count(table.data_space)
                if n is not None:
                    out[table.name] = n
        return out

    def status(self) -> dict[str, object]:
        first = next((lane.tables for lane in self.lanes if lane.tables is not None), None)
        cp = first.checkpoint if first is not None else None
        return {
            "agent": ", ".join(lane.name for lane in self.lanes),
            "topic": self.topic.name,
            "partition": self.partition,
            "phase": self.phase.value,
            "busy": self.busy,
            "start_position": self.start_position,
            "next_position": self.next_position,
            "lag": self.lag,
            "processed": self.processed,
            "restored": self.restored,
            "replayed": self.replayed,
            "unversioned": self.unversioned,
            "outcomes": _named(self.outcomes),
            "store_position": None if cp is None else cp.history,
            "caught_up": None if cp is None else cp.caught_up,
            "checkpoint": None if cp is None else cp.live,
            "agents": {lane.name: _lane_status(lane) for lane in self.lanes},
        }


def _history_at(
    done: dict[Lane, int], *, caught_up: bool = False
) -> Callable[[Lane, Checkpoint], Checkpoint]:
    """Checkpoints advanced to the store positions in ``done`` (other lanes' unchanged)."""

    def advanced(lane: Lane, cp: Checkpoint) -> Checkpoint:
        if lane not in done:
            return cp
        cp = cp.advanced(history=done[lane])
        return cp.advanced(caught_up=True) if caught_up else cp

    return advanced


def _lane_status(lane: Lane) -> dict[str, object]:
    cp = lane.tables.checkpoint if lane.tables is not None else None
    return {
        "position": lane.next,
        "outcomes": _named(lane.outcomes),
        "chain": dict(lane.chain_totals),
        "store_position": None if cp is None else cp.history,
        "caught_up": None if cp is None else cp.caught_up,
    }


def _named(outcomes: dict[Outcome, int]) -> dict[str, int]:
    return {o.value: n for o, n in sorted(outcomes.items(), key=lambda kv: kv[0].value)}


def _store_position(deliveries: Sequence[Delivery]) -> int | None:
    """The highest event-store position the forwarder stamped on ``deliveries``."""
    best: int | None = None
    for delivery in deliveries:
        for name, value in delivery.headers:
            if name == STORE_POSITION_HEADER:
                try:
                    position = int(value)
                except ValueError:
                    break
                if best is None or position > best:
                    best = position
                break
    return best


def decode_stored(delivery: Delivery) -> Event:
    """A stored event: structured JSON in the delivery's value."""
    return structured.from_stored(delivery.value or b"")


def _close_when_opened(opening: asyncio.Future[Store]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
