"""Which partitions this worker consumes: the membership protocol over RabbitMQ itself.

Kafka's consumer group is the model; RabbitMQ has none, so workers of one app form one
through the broker, with no extra service (prior art: Jack Vanlightly's Rebalanser).

The protocol (:class:`RabbitMembership`):

- **Heartbeats.** Every worker has an exclusive queue bound to the app's fanout exchange
  ``{app}-members`` (made by ``streamapp topics create``) and publishes there, every
  ``amqp_heartbeat_ms``, who it is, where its views answer and the partitions it *holds*
  (a partition task is open: it may be consuming). A worker not heard from for
  ``amqp_session_timeout_ms`` is gone; a clean leave says so at once.
- **Assignment.** Every worker computes the same assignment from the members it hears:
  sorted by id, partition ``p`` of every source topic goes to member ``p % n``
  (co-partitioned topics stay together, as with Kafka's assignor).
- **Handover.** A worker *releases* a held partition that is no longer its own (the task
  finishes its batch, commits and acks, the consumer is cancelled), then says so in a
  heartbeat at once. It *takes* a partition assigned to it only when no other live member
  holds it: the previous owner has stopped consuming, so the replay from the event store
  that every open starts with (RabbitMQ keeps no changelog) sees every event the previous
  owner applied, and the queue holds the rest.
- **Disagreement.** Members that do not hear each other (a partition of the network, a
  stalled process) may both hold a partition. Single active consumer is the safety net:
  the broker delivers a queue to one consumer only, so one worker applies its events. When
  a worker hears another holding a partition it holds, it releases it and counts a
  *contest* of that partition in its heartbeats: a member that holds a partition someone
  else contested since it last looked re-opens it (it may have been the idle one, its
  state behind), once the other has let go. Every open replays the store first, so the
  owner by the assignment ends with what the other applied meanwhile. When contests are
  lost too (a member nobody hears), the partition task's first live batch closes the gap:
  events stored below its first store position, taken by another consumer, are replayed
  (:meth:`~streamapp.engine.task.PartitionTask.recheck`).
- **Table versions.** A heartbeat also says which table versions the member's code
  declares, which of its partitions each has live, and the version it answers each
  table from (:func:`streamapp.engine.served.local_tables`); a member beats at once when
  that changes (a lane goes live). A beat without them (an older streamapp) declares
  version 1 of each table, live on the partitions it holds.
- **Joining** waits ``2 x amqp_heartbeat_ms`` to hear the members before taking anything.
- **Coming back.** A member whose own beats were not heard back for a session timeout
  (cut off from the broker, or reconnected on a new members queue) has been called
  gone, and its partitions given away: it hears the group for ``2 x amqp_heartbeat_ms``,
  releases in one rebalance what the others hold now, and only then lets its beats
  confirm its lease again (its views answer 503 meanwhile).
- **Waking.** After its loop stalled (the process frozen or starved) for half the session
  timeout or more, every other member looks silent, though their heartbeats wait in its
  queue. A member then beats and waits for that beat to come back to its own queue: the
  beats queued meanwhile come before it, so once it is heard, everyone who kept beating
  has been heard; only then does it decide who is gone (and rebalance).

:class:`streamapp.transports.rabbitmq.pinned.StaticMembership` pins the partitions of setting
``amqp_partitions`` instead (no protocol: one worker per set, single active consumer
still guarding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustConnection,
)

from ...app import App
from ...engine.lease import Lease
from ...settings.settings import Settings
from ...versions.states import MemberTables
from .beats import decode_beat, encode_beat
from .lease import EchoLease
from .membership import Partitions

log = logging.getLogger("streamapp.rabbitmq.members")

TABLES_TICK_S = 0.2
"""How often a member compares its live lanes with what its last heartbeat said."""


def members_exchange(app: App) -> str:
    """The fanout exchange the workers of ``app`` beat on."""
    return app.members_topic


@dataclass(slots=True)
class _Member:
    seen: float
    url: str | None
    held: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    contested: dict[tuple[str, int], int] = field(default_factory=dict)
    tables: MemberTables | None = None


class RabbitMembership:
    """One worker's part in its app's group, over the ``{app}-members`` exchange."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        app: App,
        settings: Settings,
        member_id: str,
        url: Callable[[], str | None] = lambda: None,
        on_change: Callable[[], None] = lambda: None,
        tables: Callable[[], MemberTables] | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.id, self.app, self._connection, self._url = member_id, app, connection, url
        self._lease = None if lease is None else EchoLease(lease, member_id)
        """Confirmed by this member's heartbeats heard back; without it, it takes nothing."""
        self._tables = tables
        """This member's table versions, for its heartbeats (None: none said)."""
        self._beaten: object = None
        """The live lanes and latches the last heartbeat said."""
        self._on_change = on_change
        """Called after every rebalance (the source updates its readiness)."""
        self.heartbeat_s = settings.amqp_heartbeat_ms / 1000
        self.timeout_s = settings.amqp_session_timeout_ms / 1000
        self._topics = sorted({(a.topic.name, a.topic.partitions) for a in app.agents.values()})
        self.held: set[tuple[str, int]] = set()
        self.contests: dict[tuple[str, int], int] = {}
        """How often this member released a partition because another held it too."""
        self._contests_seen: dict[tuple[str, str, int], int] = {}
        """(member, topic, partition): the other members' contests already acted on."""
        self.wanted: set[tuple[str, int]] = set()
        self.others: dict[str, _Member] = {}
        self._assigned: Callable[[Partitions], None] | None = None
        self._revoked: Callable[[Partitions], Awaitable[None]] | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._kick = asyncio.Event()
        self._sent = 0
        """Sequence number of this member's last heartbeat."""
        self._echoed = 0
        """Sequence number of the last of its own heartbeats heard back."""
        self._echo = asyncio.Event()
        self._awake = asyncio.Event()
        """Cleared while a member that stalled reads what was queued meanwhile."""
        self._awake.set()
        self._lock = asyncio.Lock()
        """Held by a rebalance: a stop waits for it rather than cutting a release short."""
        self._joined = False
        self._rejoin: float | None = None
        """When this member came back from a lapse the others took for its end (see
        :meth:`_rejoining`); None otherwise."""
        self._rejoined = False
        """True once the rebalance after its rejoin window released what others hold."""
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.generation = 0
        """Changes of the member set seen (a rebalance counter, for status and tests)."""

    @property
    def lease(self) -> Lease | None:
        """This member's owner's lease (views answer from it; without it, no take)."""
        return None if self._lease is None else self._lease.lease

    @property
    def settled(self) -> bool:
        return self._joined and self.held == self.wanted

    # Directory (views forward keys of other members' partitions to them) -------------
    def member_tables(self) -> list[MemberTables] | None:
        """The table versions of the members heard within the session timeout; None
        before this member joined (it has not heard the others yet)."""
        if not self._joined:
            return None
        now = time.monotonic()
        return [
            m.tables
            for _, m in sorted(self.others.items())
            if m.tables is not None and now - m.seen < self.timeout_s
        ]

    def owner_url(self, topic: str, partition: int) -> str | None:
        now = time.monotonic()
        for member in self.others.values():
            if (topic, partition) in member.held and now - member.seen < self.timeout_s:
                return member.url
        return None

    # lifecycle -------------------------------------------------------------------------
    async def start(
        self,
        assigned: Callable[[Partitions], None],
        revoked: Callable[[Partitions], Awaitable[None]],
    ) -> None:
        self._assigned, self._revoked = assigned, revoked
        name = members_exchange(self.app)
        channel = await self._connection.channel(publisher_confirms=False)
        self._channel = channel
        self._exchange = await channel.get_exchange(name, ensure=True)
        queue = await channel.declare_queue(
            f"{name}.{self.id}",
            exclusive=True,
            auto_delete=True,
            arguments={"x-message-ttl": int(self.timeout_s * 1000)},
        )
        await queue.bind(self._exchange)
        await queue.consume(self._on_message, no_ack=True)
        if self._lease is not None:
            self._lease.begin()
        await self._send()
        self._tasks = [
            asyncio.create_task(self._beat(), name=f"members-beat-{self.id}"),
            asyncio.create_task(self._watch_tables(), name=f"members-tables-{self.id}"),
            asyncio.create_task(self._rebalancer(), name=f"members-rebalance-{self.id}"),
        ]
        await asyncio.sleep(2 * self.heartbeat_s)  # hear who is there before taking
        self._joined = True
        self._kick.set()
        log.info("member %s joined %s (%d other member(s) heard)", self.id, name, len(self.others))

    async def stop(self) -> None:
        """Release every held partition, then say goodbye (others take over at once)."""
        self._stopping = True
        async with self._lock:  # a rebalance in hand finishes its releases first
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.held and self._revoked is not None:
                held, self.held = sorted(self.held), set()
                await self._revoked(held)
        with contextlib.suppress(Exception):
            await self._send(leaving=True)
        if self._channel is not None and not self._channel.is_closed:
            with contextlib.suppress(Exception):
                await self._channel.close()

    # heartbeats --------------------------------------------------------------------------
    async def _send(self, *, leaving: bool = False) -> None:
        exchange = self._exchange
        if exchange is None:
            return
        self._sent += 1
        if self._lease is not None:
            self._lease.sent(self._sent)
        tables = self._tables() if self._tables is not None else None
        self._beaten = None if tables is None else _phases(tables)
        body = encode_beat(
            self.id, self._sent, self._url(), self.held, self.contests, tables, leaving=leaving
        )
        message = aio_pika.Message(
            body, content_type="application/json", expiration=timedelta(seconds=self.timeout_s)
        )
        await exchange.publish(message, routing_key="", timeout=self.timeout_s)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            beat = decode_beat(message.body, self.app)
        except Exception as exc:
            log.warning("ignoring a malformed heartbeat on %s: %r", members_exchange(self.app), exc)
            return
        if beat.member == self.id:
            self._echoed = max(self._echoed, beat.seq)
            self._echo.set()
            if self._rejoining():
                return  # back after the others called it gone: it hears them first
            if self._lease is not None and self._lease.heard(beat.seq):
                self._kick.set()  # confirmed again: it may take what it is assigned
            return
        self._heard(beat.member, beat.url, beat.held, beat.leaving, beat.contested, beat.tables)

    def _rejoining(self) -> bool:
        """True while this member comes back after a lapse the others took for its end.

        Unconfirmed for about a session timeout or more (cut off from the broker; or a
        reconnect, whose new members queue lost what was sent meanwhile), it has been
        called gone and its partitions were given to others, and it has called them gone
        too. Like a member joining, it hears the group for two beats; then one rebalance
        releases what the others hold now, and only after that may its own beats
        confirm its lease again. So its views never answer as owner, from the state it
        had when it was cut off, of a partition another member applies."""
        lease = self._lease
        if self._rejoin is None:
            lapse = None if lease is None else lease.lease.unconfirmed_s()
            # the others call it gone on their beat ticks: a beat's margin for their lag
            if lapse is None or lapse < self.timeout_s - self.heartbeat_s:
                return False
            self._rejoin = time.monotonic()
            self._rejoined = False
            log.warning(
                "member %s: its ownership was not confirmed for %.1fs (amqp_session_timeout_ms "
                "%.1fs: the others called it gone): hearing the group for %.1fs before it "
                "confirms its lease or takes anything",
                self.id,
                lapse,
                self.timeout_s,
                2 * self.heartbeat_s,
            )
            return True
        if not self._rejoined:
            if time.monotonic() - self._rejoin >= 2 * self.heartbeat_s:
                self._kick.set()  # the rebalance that releases what others hold
            return True
        self._rejoin, self._rejoined = None, False
        return False

    def _heard(
        self,
        member: str,
        url: str | None,
        held: frozenset[tuple[str, int]],
        leaving: bool,
        contested: dict[tuple[str, int], int],
        tables: MemberTables | None = None,
    ) -> None:
        if member == self.id:
            return
        known = self.others.get(member)
        if leaving:
            if self.others.pop(member, None) is not None:
                log.info("member %s left", member)
                self.generation += 1
                self._kick.set()
            return
        if known is None:
            log.info("member %s joined", member)
            self.generation += 1
        self.others[member] = _Member(time.monotonic(), url, held, contested, tables)
        if known is None or known.held != held or known.contested != contested:
            self._kick.set()

    async def _beat(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.heartbeat_s)
            stalled = time.monotonic() - last
            if stalled >= self.timeout_s / 2:
                self._awake.clear()  # no rebalance on what little was read so far
            try:
                await self._send()
            except Exception as exc:  # the robust connection comes back; beats resume
                log.info("heartbeat of %s not sent: %r", self.id, exc)
                if self._lease is not None:
                    self._lease.not_sent(repr(exc))
            if not self._awake.is_set():
                await self._hear_queued(stalled)
            now = last = time.monotonic()
            gone = [m for m, s in self.others.items() if now - s.seen >= self.timeout_s]
            for member in gone:
                log.warning(
                    "member %s not heard for %.1fs (amqp_session_timeout_ms): gone",
                    member,
                    self.timeout_s,
                )
                del self.others[member]
                self.generation += 1
            if gone:
                self._kick.set()

    async def _watch_tables(self) -> None:
        """Beat at once when this member's live lanes or latches change."""
        while self._tables is not None:
            await asyncio.sleep(TABLES_TICK_S)
            if _phases(self._tables()) != self._beaten:
                try:
                    await self._send()
                except Exception as exc:  # the next beat says it
                    log.info("heartbeat of %s not sent: %r", self.id, exc)

    async def _hear_queued(self, stalled: float) -> None:
        """After a stall, hear the beats queued meanwhile: they come before the beat just
        sent, so wait until it comes back (beating on, at most a session timeout)."""
        sent, deadline = self._sent, time.monotonic() + self.timeout_s
        log.warning(
            "member %s: its loop stalled for %.1fs; reading the heartbeats queued meanwhile "
            "before deciding who is gone",
            self.id,
            stalled,
        )
        try:
            while self._echoed < sent:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning(
                        "member %s: its own heartbeat did not come back within %.1fs "
                        "(amqp_session_timeout_ms); deciding on what it heard",
                        self.id,
                        self.timeout_s,
                    )
                    return
                self._echo.clear()
                try:
                    async with asyncio.timeout(min(self.heartbeat_s, left)):
                        await self._echo.wait()
                except TimeoutError:
                    with contextlib.suppress(Exception):
                        await self._send()  # the others must hear this member meanwhile
        finally:
            self._awake.set()
            self._kick.set()

    # rebalancing -------------------------------------------------------------------------
    async def _rebalancer(self) -> None:
        while True:
            await self._kick.wait()
            await self._awake.wait()
            self._kick.clear()
            try:
                async with self._lock:
                    if self._stopping:
                        return
                    if self._joined:
                        await self._rebalance()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("rebalance of %s failed (%r); trying again", self.id, exc)
                await asyncio.sleep(self.heartbeat_s)
                self._kick.set()

    async def _rebalance(self) -> None:
        assert self._assigned is not None
        assert self._revoked is not None
        members = sorted([self.id, *self.others])
        me, n = members.index(self.id), len(members)
        self.wanted = {(t, p) for t, count in self._topics for p in range(count) if p % n == me}
        taken: set[tuple[str, int]] = set()
        reopen: set[tuple[str, int]] = set()
        seen = self._contests_seen
        for name, member in self.others.items():
            taken |= member.held
            for (t, p), count in member.contested.items():
                if count > seen.get((name, t, p), 0):
                    seen[(name, t, p)] = count
                    if (t, p) in self.held:
                        reopen.add((t, p))
        conflicts = sorted(self.held & taken)
        for partition in conflicts:
            self.contests[partition] = self.contests.get(partition, 0) + 1
        release = (self.held - self.wanted) | set(conflicts) | reopen
        changed = False
        if reopen:
            log.warning(
                "%s: another member contested %s, which this member holds: re-opening it "
                "(its replay brings in what the other applied)",
                self.id,
                _names(sorted(reopen)),
            )
        if release:
            if conflicts:
                log.warning(
                    "%s: another member holds %s too: releasing (single active consumer "
                    "kept one of us applying); the assigned owner takes it again and replays",
                    self.id,
                    _names(conflicts),
                )
            await self._revoked(sorted(release))  # held (and announced) until let go
            self.held -= release
            changed = True
        take = self.wanted - self.held - taken
        if take and self._lease is not None and not self._lease.held:
            log.warning(
                "member %s takes none of %s: %s", self.id, _names(sorted(take)), self._lease.why
            )
            take = set()
        if take:
            self.held |= take
            self._assigned(sorted(take))
            changed = True
        if self._rejoin is not None and time.monotonic() - self._rejoin >= 2 * self.heartbeat_s:
            self._rejoined = True  # what others hold is let go: its beats may confirm it
        self._on_change()
        if changed or self._rejoined:
            await self._send()
            log.info(
                "member %s of %d holds %s (waiting for %s)",
                self.id,
                n,
                _names(sorted(self.held)),
                _names(sorted(self.wanted - self.held)) or "nothing",
            )


def _phases(tables: MemberTables) -> object:
    """What a heartbeat says of live lanes and latches (progress aside: every beat)."""
    return [(d.table, d.version, d.live) for d in tables.declared], dict(tables.serving)


def _names(partitions: Iterable[tuple[str, int]]) -> str:
    return " ".join(f"{t}[{p}]" for t, p in partitions)
