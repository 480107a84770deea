"""The one commit order of streamapp, for every transport (:class:`Commit`).

A partition task commits the open batch of every lane (agent) of its partition here:
their tables' changes and checkpoints, their derived events, and the source position
up to which every lane has settled. The order:

1. the changelogs get every lane's changes and checkpoint, with the derived events sent,
   atomically (Kafka: in the worker's transaction of this poll cycle, which holds the
   batches of every partition of the worker that committed in the cycle, exactly-once
   v2; a new owner restores only committed batches, a ``read_committed`` reader sees
   only committed sends). The transaction carries the partition's source offset,
   committed with the group's generation and member id, so that the group coordinator
   refuses a zombie's transaction: the batch's own end when a lane has no tables (and
   so no checkpoint), else the position already durable before the batch (step 3
   commits the batch's own). Without a transaction (RabbitMQ, the memory broker) the
   derived events are published, confirmed, here instead;
2. each lane's store gets the same changes and checkpoint in one atomic write;
3. the source settles up to the position (acks; a Kafka offset not in 1).

A failure of the transaction in 1 (any partition's send, a fence, the deadline) fails
the batch of every partition in it: each rewinds to its checkpoint, nothing of any is
applied twice. A crash between 1 and 2 leaves a store behind its changelog: the next
open restores the tail. With a transaction shared by several partitions, the crash may
come after some of them wrote their stores and before the others did (each partition's
write is its own task's): each store is either at the transaction or before it, and
the ones before restore their tail, partition by partition. A crash between 2 and 3
leaves the source behind the store: the checkpoint says where to resume, and the
stream-version guard skips what a redelivery repeats (sends made in 1 without a
transaction go out again then: at least once). Nothing is settled before it is durable
in the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..errors import StoreBehindError, StoreCorruptError, StreamappError
from ..tables.checkpoint import Checkpoint
from ..tables.partition import BatchChanges
from .interfaces import Committed, PartitionPort, Publish, TaskMetrics, Transaction
from .lane import Lane


class Commit:
    """Commits the open batches of a partition task's lanes in the one order above."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        port: PartitionPort,
        transaction: Transaction | None,
        publish: Publish | None,
        metrics: TaskMetrics,
    ) -> None:
        self.lanes, self.port, self.transaction = lanes, port, transaction
        self._publish, self.metrics = publish, metrics
        self.trace = lanes[0].trace if lanes else None
        """The span of each commit (its lanes share their task's): None, tracing off."""

    def ahead(self, settle: int) -> dict[str, int]:
        """Lanes whose position is beyond ``settle`` (kept with it by the transport)."""
        return {
            lane.name: lane.next
            for lane in self.lanes
            if lane.next is not None and lane.next > settle
        }

    def durable(self) -> Committed | None:
        """The source position every live lane has durable before the batch in hand,
        with the lanes beyond it. None when a lane has none yet (a replay; a new table's
        first batch, which its store checkpoint does not hold yet): that transaction
        carries no offset, and the group does not check it."""
        held = [lane for lane in self.lanes if lane.committed is not None]
        if not held or any(
            lane.tables is not None and lane.tables.checkpoint.live is None for lane in held
        ):
            return None
        position = min(lane.committed for lane in held if lane.committed is not None)
        ahead = {
            lane.name: lane.committed
            for lane in held
            if lane.committed is not None and lane.committed > position
        }
        return Committed(position, ahead)

    async def __call__(
        self, settle_at: int | None, checkpoint: Callable[[Lane, Checkpoint], Checkpoint]
    ) -> None:
        """Commit every lane's open batch, each with ``checkpoint(lane, current)``, and
        settle the source up to ``settle_at`` (None: a replayed batch, nothing to
        settle). Raises StoreBehindError when a store write failed after step 1."""
        if self.trace is None:
            await self._commit(settle_at, checkpoint)
            return
        with self.trace.committing(settle_at):
            await self._commit(settle_at, checkpoint)

    async def _commit(
        self, settle_at: int | None, checkpoint: Callable[[Lane, Checkpoint], Checkpoint]
    ) -> None:
        started = time.perf_counter()
        durable = self.durable() if self.transaction is not None else None
        changes: list[tuple[Lane, BatchChanges]] = []
        for lane in self.lanes:
            tables = lane.tables
            if tables is None:
                continue
            cp = checkpoint(lane, tables.checkpoint)
            batch = tables.take_batch(cp)
            if not batch.empty or cp != tables.checkpoint:
                changes.append((lane, batch))
        outputs = [m for lane in self.lanes if lane.outbox is not None for m in lane.outbox.take()]
        ahead = {} if settle_at is None else self.ahead(settle_at)
        settled = False
        positions: list[int | None] = [None] * len(changes)
        if self.transaction is not None:
            # A lane without tables has no checkpoint: its position is the offset, which
            # must then be in the transaction. Lanes with tables resume from their
            # checkpoints (in the transaction): their offset is settled after the store
            # write, and the transaction carries the one durable before the batch.
            in_txn = settle_at is not None and any(lane.tables is None for lane in self.lanes)
            settle = Committed(settle_at, ahead) if in_txn and settle_at is not None else None
            if settle is None:  # the group's check of this worker's membership
                settle = durable
            committed = await self.transaction.commit(
                [(lane.agent, batch) for lane, batch in changes], outputs, settle
            )
            positions, settled = list(committed), in_txn
        elif outputs:
            if self._publish is None:
                raise StreamappError("derived events to send, but no broker to send them to")
            await self._publish(outputs)
        try:
            # Synchronous on purpose: rocksdict holds the GIL while writing, so a thread
            # would not free the loop, and a write must never race the store's close.
            for (lane, batch), position in zip(changes, positions, strict=True):
                assert lane.tables is not None
                lane.tables.write(batch, position)
                if settle_at is not None:  # durable for this lane, whatever the next does
                    lane.committed = lane.next
        except StoreCorruptError:
            raise  # the task rebuilds the store from its changelog: this batch included
        except Exception as exc:
            if self.transaction is not None:  # committed: running it again sends twice
                raise StoreBehindError(
                    f"the store write failed after the transaction committed ({exc!r})"
                ) from exc
            raise
        if settle_at is not None and not settled:
            await self.port.settle(settle_at, ahead)
        duration = time.perf_counter() - started
        for lane in self.lanes:
            self.metrics.commit(lane.name, duration)
            if lane.copies:
                lane.copies_committed(self.metrics)
