"""An owner's lease: a worker answers as owner of its partitions only while the group
confirmed its membership within ``owner_lease_s`` (setting, below the session timeout).

A worker cut off from its group keeps its partition tasks (nothing tells it they moved)
while the group hands them to others after the session timeout. The lease closes that
window: the transport confirms it (Kafka: a heartbeat of this worker's generation that
the group coordinator accepted; RabbitMQ: the member's own membership heartbeat the
broker confirmed), and past ``owner_lease_s`` without a confirmation views answer 503,
``/readyz`` is 503 and ``/status`` says ``unconfirmed``; a Kafka task starts no
transactional writer (which would fence the rightful owner). Since the lease is shorter
than the session timeout, the group cannot have moved a partition while its lease holds.

A confirmation counts from when its request was *sent* (a slow answer confirms no more
than its request proves), and only for the term it was sent under (a generation: a
confirmation that arrives after the next rebalance began confirms nothing). Times are
this worker's monotonic clock; no wall clock is compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class Lease:
    """This worker's lease on the partitions it owns in the current term (generation)."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        """How long a confirmation holds (setting ``owner_lease_s``)."""
        self.clock = clock
        self.term: Hashable | None = None
        """What confirmations must be sent under (Kafka: the group generation); None
        between a revoke and the next assignment."""
        self.confirmed_at: float | None = None
        """When the request of the latest confirmation of :attr:`term` was sent."""
        self.why = "not confirmed by the group yet"
        """What the last attempt to confirm met (shown while the lease has lapsed)."""
        self._since = clock()
        """When the current term began, or the last one ended."""

    def begin(self, term: Hashable, confirmed_at: float | None = None) -> None:
        """A new term (an assignment): confirmed as of ``confirmed_at`` (the assignment
        itself, as the group answered it), or not yet."""
        self.term, self.confirmed_at = term, confirmed_at
        self.why, self._since = "not confirmed by the group yet", self.clock()

    def end(self) -> None:
        """The term ended (a revoke): nothing is confirmed until the next one begins."""
        self.term, self.confirmed_at = None, None
        self.why, self._since = "the group is rebalancing", self.clock()

    def confirm(self, term: Hashable, sent_at: float) -> bool:
        """A request sent at ``sent_at`` under ``term`` was confirmed; False (and nothing
        changes) when ``term`` is no longer the current one."""
        if self.term is None or term != self.term:
            return False
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at
        return True

    def failed(self, why: str) -> None:
        """An attempt to confirm failed (the lease runs out unless another succeeds)."""
        self.why = why

    @property
    def held(self) -> bool:
        """True while the current term was confirmed within :attr:`lease_s`."""
        return self.unconfirmed_s() is None

    def unconfirmed_s(self) -> float | None:
        """None while the lease holds; else for how long ownership has not been
        confirmed: since the last confirmation was sent, or since the term began (or
        ended) when it has none."""
        now = self.clock()
        if self.term is None or self.confirmed_at is None:
            return max(now - self._since, 0.0)
        age = now - self.confirmed_at
        return None if age < self.lease_s else age

    def reason(self) -> str | None:
        """Why ownership is not confirmed (None while the lease holds), for ``/readyz``."""
        gap = self.unconfirmed_s()
        if gap is None:
            return None
        return (
            f"ownership not confirmed by the group for {gap:.1f} s "
            f"(owner_lease_s {self.lease_s:g}): {self.why}"
        )
