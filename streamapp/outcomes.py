"""The outcome of handling one delivery, and the policies for failed deliveries.

The source acts on the outcome alone (see DESIGN.md, "Outcomes and settling"): a delivery
is settled as done only when DELIVERED, FILTERED, or after a confirmed park.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import ConfigError


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
    """

    destination: str


Fallback = Park
"""The policies a bounded :class:`Redeliver` may fall back to: every policy but Redeliver
(the dead-letter step of the retry chain joins them)."""

FailurePolicy = Redeliver | Fallback


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
        return
    if not isinstance(policy, Redeliver):
        raise bad("a failure policy is Redeliver(...) or Park(destination)")
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
