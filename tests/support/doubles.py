"""In-memory test doubles of the interfaces a transport gives the engine, shared by the
unit tests (real implementations kept in memory, no mocks, as httpx's MockTransport):

- :class:`MemoryPort`: one source partition (a :class:`~streamapp.engine.interfaces.PartitionPort`)
  with records, a read position and a pause flag, recording what the task asked of it;
- :class:`RecordingTransaction`: a :class:`~streamapp.engine.interfaces.Transaction` that keeps
  every commit and counts commits that overlap;
- :class:`RecordingPublisher`: a publisher that keeps what it is given;
- :class:`StaticDirectory`: owners by partition, as a membership directory says;
- :func:`no_park`: a park that never succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamapp.agents.agent import Agent
from streamapp.engine.interfaces import NO_LANES, Committed
from streamapp.records import Delivery, DeliveryRecord, Message
from streamapp.tables.partition import BatchChanges, PartitionTables
from streamapp.versions.states import MemberTables


class MemoryPort:
    """One in-memory partition: ``records`` delivered from ``position``, a pause flag,
    and a log of the task's requests (``settled``, ``rewound``, ``begun``; ``log`` gets
    a line per settle when given). ``committed_at`` is what :meth:`committed` answers.

    ``bounded``: :meth:`end` is the number of records (lag shows); otherwise unknown (a
    live source with nothing seen yet). ``absolute`` False numbers deliveries per
    session, as RabbitMQ does."""

    def __init__(
        self,
        committed: Committed | None = None,
        *,
        bounded: bool = False,
        absolute: bool = True,
        log: list[str] | None = None,
    ) -> None:
        self.absolute = absolute
        self.bounded = bounded
        self.committed_at = committed
        self.log = log
        self.records: list[DeliveryRecord] = []
        self.position = 0
        self.paused = False
        self.settled: list[tuple[int, dict[str, int]]] = []
        self.rewound: list[int] = []
        self.begun: list[int | None] = []

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def rewind(self, position: int) -> None:
        self.rewound.append(position)
        self.position = position

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        self.settled.append((position, dict(ahead)))
        self.position = max(self.position, position)
        if self.log is not None:
            self.log.append(f"settle {position}")

    async def committed(self) -> Committed | None:
        return self.committed_at

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        self.begun.append(position)
        if position is not None:
            self.position = position
        return self.position

    def end(self) -> int | None:
        return len(self.records) if self.bounded else None

    async def through(self, position: int) -> int:
        return position

    def pending(self) -> list[DeliveryRecord]:
        """The records from the read position on (what a source would deliver next)."""
        return self.records[self.position :]


class RecordingTransaction:
    """A transaction kept in memory: each commit is recorded as (changes by agent name,
    derived events, settle); commits that overlap are counted (a task commits one batch
    at a time). ``commit_s`` makes each commit await that long, as a broker round trip
    does. A commit returns, per change, the number of commits so far."""

    def __init__(self, *, commit_s: float = 0.0) -> None:
        self.commits: list[tuple[list[tuple[str, BatchChanges]], list[Message], Any]] = []
        self.commit_s = commit_s
        self.in_flight = 0
        self.overlaps = 0

    @property
    def batches(self) -> list[BatchChanges]:
        """Every batch committed, in order."""
        return [batch for changes, _, _ in self.commits for _, batch in changes]

    async def open(self) -> None:
        pass

    async def restore(self, agent: Agent, tables: PartitionTables) -> int:
        return 0

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        self.in_flight += 1
        self.overlaps += self.in_flight > 1
        try:
            if self.commit_s:
                await asyncio.sleep(self.commit_s)
        finally:
            self.in_flight -= 1
        self.commits.append(([(a.name, b) for a, b in changes], list(outputs), settle))
        return [len(self.commits)] * len(changes)

    async def reset(self) -> None:
        pass

    async def close(self) -> None:
        pass


class RecordingPublisher:
    """A publisher that keeps what it is given, as (topic, value, key)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        self.sent.append((topic, value, key))


class StaticDirectory:
    """Owners' view URLs by partition, as a membership directory would say."""

    def __init__(self) -> None:
        self.owners: dict[int, str] = {}

    def owner_url(self, topic: str, partition: int) -> str | None:
        return self.owners.get(partition)


class TablesDirectory(StaticDirectory):
    """A directory that carries the other members' table versions, read from them
    live (what their records would say now); ``read`` False: not read yet."""

    def __init__(self) -> None:
        super().__init__()
        self.members: list[Callable[[], MemberTables]] = []
        self.read = True

    def member_tables(self) -> list[MemberTables] | None:
        return [m() for m in self.members] if self.read else None


async def no_park(delivery: Delivery, reason: str) -> bool:
    """A park that never succeeds (the delivery is not settled)."""
    return False
