"""What a lane does with a delivery its handler did not settle: the agent's failure policy.

A failed or undeliverable delivery is parked (confirmed), put on the retry chain (inline
retries, then a copy for the retry or dead-letter topic, committed with the batch), or
left for redelivery with its attempt counted; a refusal or an unavailable table read
stops the run there. :func:`settle_failed` is called by the lanes' run
(:func:`~streamapp.engine.run.run_lanes`) once per such delivery and lane; one line is
logged per failure, with the traceback the first time per partition. A record sent back
by a replay (``streamapp-replayed``) that the stream-version guard skips because its
stream applied a later event meanwhile is logged as a WARNING: its table misses it; but
not a held event's copy in a lane that holds streams: such a lane applies held events in
order, so its stream passed the event by applying it (:func:`~.hold.follow`) or by a
skip on purpose.
"""

from __future__ import annotations

import logging

from ..agents.agent import DUPLICATE, Agent, Handled, handle
from ..errors import DecodeError
from ..events import Event
from ..failures import retry_chain as chain
from ..failures.outcomes import FailurePolicy, Outcome, Park, Redeliver, Retry
from ..failures.republish import HELD_SKIP, HELD_STREAM, REPLAYED
from ..logs import Gate
from ..records import Delivery
from .backoff import pause
from .hold import hold_failed, holds_streams
from .interfaces import TaskMetrics
from .lane_surface import LaneSurface

log = logging.getLogger("streamapp.agent")


async def settle_failed(
    lane: LaneSurface,
    record: Delivery,
    item: Event | DecodeError,
    handled: Handled,
    counts: dict[Outcome, int],
    metrics: TaskMetrics,
) -> tuple[bool, Handled]:
    """Count ``handled`` and apply the lane's policy: whether the delivery is settled
    for this lane (delivered, filtered, parked with a confirm, or copied by the chain),
    and the outcome of its last attempt (the chain's inline retries make more)."""
    counts[handled.outcome] = counts.get(handled.outcome, 0) + 1
    if handled.outcome.settles:
        if handled is DUPLICATE:
            _moved_on(lane, record, item)
        return True, handled
    agent = lane.agent
    if handled.outcome is Outcome.REFUSED:
        _log(agent, record, handled, "the agent stops for good", logging.ERROR)
        return False, handled
    if handled.outcome is Outcome.UNAVAILABLE:
        _log(
            agent, record, handled, "will deliver it again after a pause", logging.INFO, trace=False
        )
        return False, handled
    metrics.failed_attempts(agent.name, 1)
    policy: FailurePolicy = agent.on_failure
    if isinstance(policy, Retry):
        return await _chain(lane, record, item, handled, counts, metrics, policy)
    reason, attempt = handled.reason, lane.attempts.before(record) + 1
    if isinstance(policy, Redeliver) and policy.spent(attempt) and policy.fallback:
        policy, reason = policy.fallback, f"gave up after {attempt} attempts: {reason}"
    if isinstance(policy, Park) and await _park(lane, record, item, reason, policy):
        _log(agent, record, handled, "parked", logging.DEBUG)
        metrics.parked(agent.name)
        return True, handled
    lane.attempts.failed_at(record.position, handled.reason)
    then = f"will redeliver (attempt {attempt}{_of(agent.on_failure)})"
    _log(agent, record, handled, then, logging.WARNING)
    return False, handled


async def _park(
    lane: LaneSurface, record: Delivery, item: Event | DecodeError, reason: str, policy: Park
) -> bool:
    """Park ``record`` (confirmed); with ``hold="stream"`` its stream is held from it."""
    if policy.holds and isinstance(item, Event) and item.stream_id is not None:
        return await hold_failed(lane, record, item, reason)
    return await lane.park(record, reason)


async def _chain(
    lane: LaneSurface,
    record: Delivery,
    item: Event | DecodeError,
    handled: Handled,
    counts: dict[Outcome, int],
    metrics: TaskMetrics,
    policy: Retry,
) -> tuple[bool, Handled]:
    """The retry chain for a delivery whose first attempt here failed: inline retries,
    then a copy to the retry topic, or to the dead-letter topic once ``max_reconsume + 1``
    failures are spent. Not settled when a stop ended an inline wait, a table read
    became unavailable, or the agent refused (that attempt's outcome is returned).
    Inline attempts are counted as failed attempts; the delivery's outcome is its last
    attempt's."""
    agent = lane.agent
    failures, hop = chain.chain_state(record.headers)
    failures += 1
    limit = policy.max_reconsume + 1
    for n, interval in enumerate(policy.intervals, 1):
        if failures >= limit:
            break
        _log(agent, record, handled, f"inline retry {n} in {interval:g}s", logging.WARNING)
        if lane.waits:
            await pause(lane.stop, interval)
        if lane.stop.is_set():
            _log(agent, record, handled, "stopping: left unsettled", logging.INFO, trace=False)
            return False, handled
        first = handled.outcome
        handled = await handle(
            agent, item, lane.tables, lane.views, lane.outbox, lane.send, lane.run
        )
        if handled.outcome.settles:  # the delivery's outcome is its last attempt's
            counts[first] -= 1
            counts[handled.outcome] = counts.get(handled.outcome, 0) + 1
            return True, handled
        if handled.outcome is Outcome.REFUSED:
            _log(agent, record, handled, "the agent stops for good", logging.ERROR)
            return False, handled
        if handled.outcome is Outcome.UNAVAILABLE:
            return False, handled
        failures += 1
        metrics.failed_attempts(agent.name, 1)
    retry_topic = policy.retry_topic(record.topic)
    if failures < limit and retry_topic is not None:
        copy = chain.retry_copy(record, policy, agent.name, failures, hop, lane.clock() * 1000)
        kind, then = "retried", f"copied to {retry_topic} (failure {failures} of {limit})"
    else:
        reason = f"failed {failures} times: {handled.reason}"
        copy = chain.dead_letter(record, policy, agent.name, failures, hop, reason)
        kind, then = "dead_lettered", f"dead-lettered to {copy.topic} after {failures} failures"
    assert lane.outbox is not None
    lane.outbox.settle(copy)
    lane.copies[kind] = lane.copies.get(kind, 0) + 1
    hop_key = (kind, chain.hop_of(copy.headers))
    lane.hops[hop_key] = lane.hops.get(hop_key, 0) + 1
    _log(agent, record, handled, then, logging.WARNING)
    return True, handled


def _moved_on(lane: LaneSurface, record: Delivery, item: Event | DecodeError) -> None:
    """Warn when ``record`` was sent back by a replay and skipped by the stream-version
    guard although its stream is past it: the event failed, a later one of its stream
    was applied meanwhile, so the table never gets it (a stream at the event's own
    version applied it before: no warning)."""
    where = chain.header(record.headers, REPLAYED)
    tables = lane.tables
    if where is None or tables is None or isinstance(item, DecodeError):
        return
    sid, version = item.stream_id, item.stream_version
    if sid is None or version is None:
        return
    applied = tables.applied_version(sid)
    if applied <= version:
        return
    agent = lane.agent
    if chain.header(record.headers, HELD_STREAM) is not None and holds_streams(lane) is not None:
        if chain.header(record.headers, HELD_SKIP) is not None:
            log.warning(
                "agent %s: the skip of event %s of stream %r (version %d, %s) came after the "
                "release applied it, in order: nothing is skipped (skip the event that "
                "holds the stream: `streamapp parked list --held`)",
                agent.name,
                item.id,
                sid,
                version,
                where.decode(errors="replace"),
            )
        return  # applied in order by the release (or skipped on purpose): not missed
    log.warning(
        "agent %s skipped %s, sent back by a replay: its stream %r moved on while it was "
        "held: the event is stream version %d and table %s has applied the stream through "
        "version %d, so the table misses this event (unless a replay applied it before). "
        "To apply it, rebuild the table: deploy it as a new table version "
        "(docs/changing-a-projection.md), or stop the workers, run `streamapp reset -A "
        "MODULE:app --agent %s --yes` and start them again (docs/catchup.md, resetting "
        "a projection)",
        agent.name,
        where.decode(errors="replace"),
        sid,
        version,
        ", ".join(t.label for t in agent.tables),
        applied,
        agent.name,
    )


_TRACEBACKS = Gate(window_s=60.0)
"""A handler's traceback: the first failure per partition, then one a minute."""


def _log(
    agent: Agent, record: Delivery, handled: Handled, then: str, level: int, *, trace: bool = True
) -> None:
    """One line per failure; with the traceback the first time per partition (then at
    most once a minute), so a poison record shows where it failed without flooding."""
    error = handled.error if trace else None
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
