"""The outcome of handling one delivery, and the policies for failed deliveries.

The source acts on the outcome alone (see DESIGN.md, "Outcomes and settling"): a delivery
is settled as done only when DELIVERED, FILTERED, or after a confirmed park.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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

    Kafka seeks back to the failed offset and pauses only that partition for
    ``pause_s`` (default: the poll timeout), so other partitions keep flowing.
    """

    pause_s: float | None = None


@dataclass(frozen=True, slots=True)
class Park:
    """Publish the failed record, with its reason, to ``destination``.

    The original counts as settled only once the broker confirmed the parked copy
    (Kafka ``acks=all``). If parking fails, the delivery is redelivered instead.
    """

    destination: str


FailurePolicy = Redeliver | Park
