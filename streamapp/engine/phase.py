"""The phases a partition task goes through, shown by status and views."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    RESTORING = "restoring"
    """Opening its store and restoring it from the changelog."""
    CATCHING_UP = "catching_up"
    """Replaying the event store into the tables; live deliveries wait."""
    LIVE = "live"
    """Handling live deliveries; views answer."""
    CLOSED = "closed"
    """Revoked or stopped."""
    LOST = "lost"
    """Another worker fenced this one; waits for the group to revoke it."""

    @property
    def serves(self) -> bool:
        """True when views may answer from this partition's committed state."""
        return self is Phase.LIVE
