"""Agents: a plain async function of one event plus the tables it declares.

:func:`run_batch` is the one place where a delivery becomes an outcome; the partition
task (:mod:`streamapp.engine.task`) calls it for every transport, so an agent behaves the
same over each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine.delivery import Decoder, Delivery, Parker, decode_delivery
from .errors import DecodeError
from .events import Event
from .history import History
from .logs import Gate
from .outcomes import FailurePolicy, Outcome, Park, Redeliver, check_policy
from .tables.partition import PartitionTables
from .tables.table import Table

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[None]]
"""``async def handler(event, *table_views) -> None``."""


@dataclass(frozen=True)
class TopicSpec:
    """A source topic: its name and partition count (its tables are partitioned alike)."""

    name: str
    partitions: int = 8

    def __post_init__(self) -> None:
        if not self.name or self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: a name and at least one partition are needed")


@dataclass(frozen=True)
class Agent:
    """One projection: the handler, its source topic, its tables and its failure policy."""

    name: str
    handler: Handler
    topic: TopicSpec
    tables: tuple[Table[Any], ...] = ()
    """In the order the handler's parameters take them (see ``App.agent``)."""
    filter: Callable[[Event], bool] | None = None
    on_failure: FailurePolicy = field(default_factory=Redeliver)
    history: History | None = None
    """Replayed into the tables on assignment, before live deliveries (catch-up)."""

    def __post_init__(self) -> None:
        check_policy(self.on_failure, self.name)

    async def __call__(self, event: Event, *views: Any) -> None:
        """Call the handler directly (handy in unit tests)."""
        await self.handler(event, *views)


@dataclass(frozen=True, slots=True)
class Handled:
    outcome: Outcome
    reason: str = ""
    error: BaseException | None = None
    """What the handler raised (its traceback is logged the first time per partition)."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """``settled`` records (a prefix of the batch) are done; ``failure`` stopped the rest."""

    settled: int
    failure: Handled | None = None
    counts: dict[Outcome, int] = field(default_factory=dict)
    unversioned: int = 0
    """Events applied to tables without ``streamversion``: no duplicate check was possible
    (at-least-once; a redelivery of one applies it again)."""

    @property
    def redeliver(self) -> bool:
        return self.failure is not None


YIELD_EVERY_S = 0.02
"""A batch gives the event loop a turn this often: handlers that never await would
otherwise hold it for a whole batch (group heartbeats, views and other partitions wait)."""

_DELIVERED = Handled(Outcome.DELIVERED)
_UNVERSIONED = Handled(Outcome.DELIVERED, "no streamversion: applied at least once")
_DUPLICATE = Handled(Outcome.FILTERED, "already applied")
_FILTERED = Handled(Outcome.FILTERED, "filter")


async def handle(
    agent: Agent, item: Event | DecodeError, tables: PartitionTables | None
) -> Handled:
    """The outcome of one delivery; table writes of a failed handler are rolled back."""
    if isinstance(item, DecodeError):
        return Handled(Outcome.NOT_DELIVERABLE, item.reason)
    event = item
    sid = event.stream_id
    if sid is None:
        return Handled(
            Outcome.NOT_DELIVERABLE,
            f"event {event.id} has no stream id (neither a streamid extension nor a subject)",
        )
    version = event.stream_version
    if tables is not None and version is not None and tables.applied_version(sid) >= version:
        return _DUPLICATE
    try:
        if agent.filter is not None and not agent.filter(event):
            return _FILTERED
        if tables is None:
            await agent.handler(event)
        else:
            await agent.handler(event, *tables.views)
    except Exception as exc:
        return _failed(tables, exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # a real cancellation of the batch
        return _failed(tables, exc)  # a handler's own timeout leaking out
    if tables is not None:
        if version is None:
            tables.commit_event()
            return _UNVERSIONED
        tables.record_version(sid, version)
        tables.commit_event()
    return _DELIVERED


def _failed(tables: PartitionTables | None, exc: BaseException) -> Handled:
    if tables is not None:
        tables.rollback_event()
    return Handled(Outcome.FAILED, f"{type(exc).__name__}: {exc}", exc)


async def run_batch(
    agent: Agent,
    records: Sequence[Delivery],
    tables: PartitionTables | None,
    decode: Decoder,
    park: Parker,
    budget_s: float,
    *,
    failed_before: Callable[[Delivery], int] = lambda record: 0,
) -> BatchResult:
    """Run ``records`` (one partition, in order) through ``agent``.

    Stops at the first failure that the policy does not settle (REDELIVER, or a park
    that was not confirmed), or when ``budget_s`` is spent, so the caller can flush the
    settled prefix and seek back to the rest. ``failed_before`` tells how many attempts
    of a record failed already: once a bounded Redeliver's attempts are spent, its
    fallback applies instead.
    """
    now = time.monotonic()
    deadline, next_yield = now + budget_s, now + YIELD_EVERY_S
    counts: dict[Outcome, int] = {}
    delivered = unversioned = 0  # the common cases, counted without hashing an enum
    for i, record in enumerate(records):
        if i:
            now = time.monotonic()
            if now > deadline:  # out of time
                return BatchResult(i, counts=_counts(counts, delivered), unversioned=unversioned)
            if now > next_yield:  # let heartbeats, views and other partitions in
                await asyncio.sleep(0)
                next_yield = time.monotonic() + YIELD_EVERY_S
        handled = await handle(agent, decode_delivery(decode, record), tables)
        if handled is _DELIVERED:
            delivered += 1
            continue
        if handled is _UNVERSIONED:
            delivered += 1
            unversioned += 1
            continue
        counts[handled.outcome] = counts.get(handled.outcome, 0) + 1
        if handled.outcome.settles:
            continue
        policy: FailurePolicy = agent.on_failure
        reason, attempt = handled.reason, failed_before(record) + 1
        if isinstance(policy, Redeliver) and policy.spent(attempt) and policy.fallback:
            policy, reason = policy.fallback, f"gave up after {attempt} attempts: {reason}"
        if isinstance(policy, Park) and await park(record, reason):
            _log_failure(agent, record, handled, "parked", logging.DEBUG)
            continue
        then = f"will redeliver (attempt {attempt}{_of(agent.on_failure)})"
        _log_failure(agent, record, handled, then, logging.WARNING)
        return BatchResult(
            i, failure=handled, counts=_counts(counts, delivered), unversioned=unversioned
        )
    return BatchResult(len(records), counts=_counts(counts, delivered), unversioned=unversioned)


_TRACEBACKS = Gate(window_s=60.0)
"""A handler's traceback: the first failure per partition, then one a minute."""


def _log_failure(agent: Agent, record: Delivery, handled: Handled, then: str, level: int) -> None:
    """One line per failure; with the traceback the first time per partition (then at
    most once a minute), so a poison record shows where it failed without flooding."""
    error = handled.error
    traceback = error is not None and _TRACEBACKS.due((agent.name, record.topic, record.partition))
    log.log(
        logging.WARNING if traceback else level,
        "agent %s: %s[%d]@%d %s (%s); %s",
        agent.name,
        record.topic,
        record.partition,
        record.position,
        handled.outcome.value,
        handled.reason,
        then,
        exc_info=error if traceback else None,
    )


def _of(policy: FailurePolicy) -> str:
    bound = policy.max_attempts if isinstance(policy, Redeliver) else None
    return "" if bound is None else f" of {bound}"


def _counts(counts: dict[Outcome, int], delivered: int) -> dict[Outcome, int]:
    if delivered:
        counts[Outcome.DELIVERED] = counts.get(Outcome.DELIVERED, 0) + delivered
    return counts
