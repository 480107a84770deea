"""The owner's lease on RabbitMQ: a member's own heartbeat, heard back through the broker.

A member's heartbeat goes to the app's fanout exchange, which routes it to every
member's queue, its own too (:mod:`streamapp.transports.rabbitmq.members`). Heard back, it was
routed to every queue bound then: the others hear it too, and do not call the member
gone before a session timeout after it. So a heartbeat heard back confirms the lease as
of when it was sent (:class:`~streamapp.engine.lease.Lease`); a member cut off from the
broker hears nothing back, its lease lapses after ``owner_lease_s`` (below
``amqp_session_timeout_ms``), and it takes no partition meanwhile.
"""

from __future__ import annotations

from ...engine.lease import Lease

KEPT = 64
"""Send times kept of heartbeats not heard back yet (older ones are dropped)."""


class EchoLease:
    """Confirms ``lease`` with this member's heartbeats as they come back."""

    def __init__(self, lease: Lease, member_id: str) -> None:
        self.lease, self.member_id = lease, member_id
        self._sent: dict[int, float] = {}
        """Send time of each heartbeat not heard back yet, by sequence number."""

    def begin(self) -> None:
        """The member joins: not confirmed until its first heartbeat comes back."""
        self.lease.begin(self.member_id)

    def sent(self, seq: int) -> None:
        if self._sent:
            self.lease.failed("its heartbeats are not heard back from the broker")
        self._sent[seq] = self.lease.clock()
        if len(self._sent) > KEPT:
            del self._sent[min(self._sent)]

    def not_sent(self, why: str) -> None:
        self.lease.failed(f"heartbeat not sent ({why})")

    def heard(self, seq: int) -> bool:
        """Heartbeat ``seq`` came back; True when it renewed a lapsed lease (a member
        that took nothing meanwhile rebalances then)."""
        sent = self._sent.pop(seq, None)
        for older in [s for s in self._sent if s < seq]:
            del self._sent[older]  # lost, or overtaken: they confirm nothing more
        if sent is None:
            return False
        lapsed = not self.lease.held
        self.lease.confirm(self.member_id, sent)
        return lapsed and self.lease.held

    @property
    def held(self) -> bool:
        return self.lease.held

    @property
    def why(self) -> str:
        """Why the lease is not held (what :meth:`~streamapp.engine.lease.Lease.reason` says)."""
        return self.lease.reason() or "its lease holds"
