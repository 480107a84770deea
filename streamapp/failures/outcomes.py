"""The outcome of handling one delivery, and the policies for failed deliveries.

The source acts on the outcome alone (see DESIGN.md, "Outcomes and settling"): a delivery
is settled as done only when DELIVERED, FILTERED, or after a confirmed park.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    """The handler ran without raising."""
    FILTERED = "filtered"
    """The agent's filter (or the stream-version guard) declined the event."""
    DEFERRED = "deferred"
    """Not ready for live events yet (catch-up running)."""
    UNAVAILABLE = "unavailable"
    """No agent is active for the delivery right now."""
    REFUSED = "refused"
    """The agent stopped for good."""
    NOT_DELIVERABLE = "not_deliverable"
    """The record cannot be decoded or routed: the failure policy applies."""
    FAILED = "failed"
    """The handler raised: the failure policy applies."""
    HELD = "held"
    """Its stream is held (``Park(destination, hold="stream")``): parked behind the event
    that holds it, in order, without running the handler."""

    @property
    def settles(self) -> bool:
        """True when the source may count the delivery as done."""
        return self in (Outcome.DELIVERED, Outcome.FILTERED)


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Default policy: leave the delivery unsettled and try it again after a pause.

    Kafka seeks back to the failed offset and pauses only that partition, so other
    partitions keep flowing; RabbitMQ requeues it at the broker. The first pause is
    ``pause_s`` (default: the poll timeout); each further failure of the same delivery
    doubles it, up to setting ``redeliver_backoff_max_ms``.

    ``max_attempts`` bounds the attempts of one delivery, the first one included (a
    handler that raised, or a record that does not decode); None, the default, retries
    without end. Once they are spent, ``fallback`` (any
    policy but Redeliver, e.g. ``Park(destination)``) applies, with the reason
    ``gave up after N attempts: <error>``. Attempts are counted by the partition task
    per delivery position, from the first failure until the delivery settles; a
    partition that moves to another worker (or restarts, or a RabbitMQ reconnect that
    renumbers its deliveries) counts again from zero. Events replayed from the event
    store follow the same pauses and bound.
    """

    pause_s: float | None = None
    max_attempts: int | None = None
    fallback: Fallback | None = None
    """What happens to the delivery once ``max_attempts`` are spent (needs both)."""

    def spent(self, attempt: int) -> bool:
        """True when a delivery whose ``attempt``-th attempt (1-based) failed gets no more."""
        return self.max_attempts is not None and attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Park:
    """Publish the failed record, with its reason, to ``destination``.

    The original counts as settled only once the broker confirmed the parked copy
    (Kafka ``acks=all``). If parking fails, the delivery is redelivered instead.

    ``hold="stream"`` (projections): the failed event also holds its stream in the
    agent's lane of that partition; the stream's later events there are parked behind
    it, in order, without running the handler, while every other stream goes on
    (:mod:`streamapp.engine.hold`). Without it (the default), the stream's later events
    are applied without the failed one, for handlers where order does not matter.
    """

    destination: str
    hold: Literal["stream"] | None = None
    """``"stream"``: a failed event holds its stream (None: it parks the event alone)."""

    @property
    def holds(self) -> bool:
        """True when a failed event holds its stream."""
        return self.hold == "stream"

    def __repr__(self) -> str:
        hold = "" if self.hold is None else f", hold={self.hold!r}"
        return f"Park(destination={self.destination!r}{hold})"


@dataclass(frozen=True, slots=True)
class Retry:
    """The retry chain: retries that never hold the partition for long.

    A failed delivery is tried again in place after each of ``intervals`` (seconds);
    then a copy goes to ``{topic}{retry_suffix}`` with the chain's headers (failures so
    far, round trip, due time, origin topic) and the original counts as settled once
    that copy is committed with the batch. The worker's relay republishes the copy to
    the origin topic when it is due, after ``backoff[hop - 1]`` seconds (beyond the
    table, its last value), and the chain starts again there, counting on. After
    ``max_reconsume + 1`` failures in all, the record goes to ``{topic}{dlq_suffix}``
    with the reason. An empty ``retry_suffix`` disables the retry topic: inline
    retries, then the dead-letter topic.
    """

    intervals: tuple[float, ...] = (0.1, 0.5)
    max_reconsume: int = 16
    backoff: tuple[float, ...] = (1, 5, 10, 30, 60, 120, 180, 240)
    retry_suffix: str = "-retry"
    dlq_suffix: str = "-dlq"

    def retry_topic(self, topic: str) -> str | None:
        """Where copies of ``topic``'s failed records wait (None: no retry topic)."""
        return f"{topic}{self.retry_suffix}" if self.retry_suffix else None

    def dlq_topic(self, topic: str) -> str:
        """Where ``topic``'s records go once their failures are spent."""
        return f"{topic}{self.dlq_suffix}"

    def backoff_s(self, hop: int) -> float:
        """The wait before round trip ``hop`` (1-based) comes back to the origin topic."""
        return float(self.backoff[min(max(hop, 1), len(self.backoff)) - 1])


Fallback = Park
"""The policies a bounded :class:`Redeliver` may fall back to: every policy but Redeliver
(the dead-letter step of the retry chain joins them)."""

FailurePolicy = Redeliver | Fallback | Retry


def parking(policy: FailurePolicy) -> Park | None:
    """Where ``policy`` parks a failed delivery: itself, or the fallback of a bounded
    Redeliver (None: it never parks)."""
    target = policy.fallback if isinstance(policy, Redeliver) else policy
    return target if isinstance(target, Park) else None


def check_policy(policy: object, agent: str) -> None:
    """Raise ConfigError, naming ``agent``, when ``policy`` cannot work as given."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"agent {agent!r}: on_failure={policy!r}: {why}")

    if isinstance(policy, Park):
        if not isinstance(policy.destination, str) or not policy.destination.strip():
            raise bad("the parking destination must be a non-blank name")
        _check_hold(policy, bad)
        return
    if isinstance(policy, Retry):
        _check_retry(policy, bad)
        return
    if not isinstance(policy, Redeliver):
        raise bad(
            "a failure policy is Redeliver(...) or Park(destination), or Retry(...) for "
            "the retry chain"
        )
    if policy.pause_s is not None and not policy.pause_s >= 0:
        raise bad("pause_s must be zero or more seconds (None: the poll timeout)")
    attempts: object = policy.max_attempts
    fallback: object = policy.fallback
    if attempts is None:
        if fallback is not None:
            raise bad("a fallback applies once the attempts are spent: give max_attempts too")
        return
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise bad("max_attempts must be an integer of at least 1 (None: no bound)")
    if fallback is None:
        raise bad(
            f"after {attempts} attempts the delivery needs somewhere to go: give "
            "fallback=Park(destination), or max_attempts=None to redeliver without end"
        )
    if isinstance(fallback, Redeliver):
        raise bad("the fallback cannot be another Redeliver: give e.g. Park(destination)")
    if not isinstance(fallback, Park):
        raise bad("the fallback must be a policy other than Redeliver, e.g. Park(destination)")
    if not isinstance(fallback.destination, str) or not fallback.destination.strip():
        raise bad("the fallback's parking destination must be a non-blank name")
    _check_hold(fallback, bad)


def _check_hold(policy: Park, bad: Callable[[str], ConfigError]) -> None:
    if policy.hold is not None and policy.hold != "stream":
        raise bad(
            f"hold={policy.hold!r} is not a hold: give hold='stream' (a failed event holds "
            "its stream) or leave it out (the event is parked alone)"
        )


def _check_retry(policy: Retry, bad: Callable[[str], ConfigError]) -> None:
    def seconds(name: str, values: object, *, empty: bool) -> None:
        if not isinstance(values, tuple) or (not values and not empty):
            need = "a tuple of seconds" + ("" if empty else ", at least one")
            raise bad(f"{name} must be {need}, e.g. {name}=(0.1, 0.5)")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(f"{name} holds {v!r}: give seconds as numbers")
            if v < 0:
                raise bad(f"{name} holds {v!r}: waits are zero or more seconds")

    seconds("intervals", policy.intervals, empty=True)
    seconds("backoff", policy.backoff, empty=False)
    n: object = policy.max_reconsume
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise bad("max_reconsume must be an integer of 0 or more (failures allowed: it + 1)")
    for name in ("retry_suffix", "dlq_suffix"):
        suffix: object = getattr(policy, name)
        if not isinstance(suffix, str) or suffix != suffix.strip():
            raise bad(f"{name} must be a string without spaces, e.g. '-retry'")
    if not policy.dlq_suffix:
        raise bad("dlq_suffix must not be empty: the dead-letter topic is {topic}{dlq_suffix}")
    if policy.retry_suffix == policy.dlq_suffix:
        raise bad("retry_suffix and dlq_suffix must differ (two topics)")
