"""Parking: a failed delivery is published, with its reason, to the policy's destination
(``Park``, or the ``Park`` fallback of a bounded ``Redeliver``).

The original counts as settled only once the sink confirmed the copy; a park that fails
leaves the delivery unsettled, so it is redelivered instead.
"""

from __future__ import annotations

import logging

from ..agents.agent import Agent
from ..failures.outcomes import parking
from ..records import Delivery
from .delivery import Parker, park_headers
from .interfaces import Sink

log = logging.getLogger("streamapp.partition")


def parker(sink: Sink | None, agent: Agent, name: str) -> Parker:
    """The Parker of ``agent``'s partition ``name``: confirmed publishes through ``sink``."""

    async def park(delivery: Delivery, reason: str) -> bool:
        policy = parking(agent.on_failure)
        if policy is None:
            return False
        if sink is None:
            log.error("%s: cannot park position %d: no broker to park to", name, delivery.position)
            return False
        headers = park_headers(delivery, reason, agent.name)
        try:
            await sink.publish(
                policy.destination, delivery.value, key=delivery.key, headers=headers
            )
        except Exception as exc:
            log.error("%s: parking position %d failed: %s", name, delivery.position, exc)
            return False
        log.warning(
            "%s: parked position %d to %s: %s", name, delivery.position, policy.destination, reason
        )
        return True

    return park
