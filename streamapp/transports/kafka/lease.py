"""The owner's lease on Kafka: heartbeats of this worker's generation, sent by the lease.

aiokafka's consumer heartbeats on its own and tells nobody whether one succeeded. So the
lease sends its own ``Heartbeat`` requests, every third of ``owner_lease_s``, with the
group generation and member id the consumer was assigned under (the coordinator takes
them from any connection: one more heartbeat only keeps the member alive), through its
own :class:`~aiokafka.AIOKafkaClient`. An answer without error confirms the lease as of
when the request was sent (:meth:`~streamapp.engine.lease.Lease.confirm`), for that
generation only; an error (``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION``,
``REBALANCE_IN_PROGRESS``, no answer) confirms nothing, and the consumer's own
heartbeat finds the same and rejoins. A coordinator that accepted the heartbeat keeps
the member for a whole session timeout from then, longer than the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaClient
from aiokafka.client import CoordinationType
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorForGroupError,
    for_code,
)
from aiokafka.protocol.group import HeartbeatRequest

from ...engine.lease import Lease
from .members import Generation

log = logging.getLogger("streamapp.kafka")


class HeartbeatLease:
    """Keeps ``lease`` confirmed while the group coordinator accepts heartbeats of the
    generation ``generation()`` returns (None: between a revoke and an assignment)."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        lease: Lease,
        generation: Callable[[], Generation | None],
    ) -> None:
        self.bootstrap, self.group_id, self.lease = bootstrap, group_id, lease
        self.generation = generation
        self.interval_s = lease.lease_s / 3
        self._client: AIOKafkaClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._coordinator: int | None = None

    async def start(self) -> None:
        client = AIOKafkaClient(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.group_id}-lease",
            request_timeout_ms=max(int(self.lease.lease_s * 1000), 1000),
        )
        try:
            await client.bootstrap()
        except BaseException:
            await client.close()
            raise
        self._client = client
        self._task = asyncio.create_task(self._run(), name="owner lease")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    async def _run(self) -> None:
        while True:
            generation = self.generation()
            if generation is not None:
                sent = time.monotonic()
                why = await self.beat(generation)
                if why is None:
                    self.lease.confirm(generation, sent)
                else:
                    self.lease.failed(why)
                wait = self.interval_s - (time.monotonic() - sent)
            else:
                wait = self.interval_s
            await asyncio.sleep(max(wait, 0.05))

    async def beat(self, generation: Generation) -> str | None:
        """One heartbeat of ``generation``; None when the coordinator accepted it, else
        why not."""
        client = self._client
        assert client is not None
        try:
            async with asyncio.timeout(self.lease.lease_s):
                if self._coordinator is None:
                    self._coordinator = await client.coordinator_lookup(
                        CoordinationType.GROUP, self.group_id
                    )
                request = HeartbeatRequest(self.group_id, generation.number, generation.member_id)
                response = await client.send(self._coordinator, request)
        except (KafkaError, TimeoutError, OSError) as exc:
            self._coordinator = None  # looked up again: it may have moved
            return f"no heartbeat answered ({exc!r})"
        if response.error_code == 0:
            return None
        error = for_code(response.error_code)
        if error in (NotCoordinatorForGroupError, GroupCoordinatorNotAvailableError):
            self._coordinator = None
        return (
            f"the group coordinator refused a heartbeat of generation {generation.number}: "
            f"{error.__name__}"
        )
