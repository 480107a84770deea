"""Back to the durable state after a failed commit (:func:`recover`).

A commit can fail at any step (the broker away, a transaction timed out, a store write
refused). The task then drops the batch in hand and starts again from what is durable:
the checkpoints in its stores, which the changelogs' committed tail may be ahead of.
"""

from __future__ import annotations

import logging

from ..errors import FencedError
from .backoff import Pace
from .opening import restore_tail
from .phase import Phase
from .rebuild import rebuild_damaged
from .task_surface import TaskSurface

log = logging.getLogger("streamapp.partition")


async def recover(task: TaskSurface) -> bool:
    """After a failed commit: drop the batch, reset the transaction, rewind to the
    checkpoint. Retries with back-off while the partition is ours; False when it is not
    (closed, lost) and the task stops taking deliveries.

    A transaction that timed out may still have committed. The reset fences it (it is
    then committed or aborted for good) and the changelogs' committed tail is restored
    into the stores, as a new owner would: a batch that committed after all is in the
    stores and checkpoints then, and is not run again (its derived events and copies
    would go out twice)."""
    pace = Pace(task.closing)
    while task.phase in (Phase.LIVE, Phase.CATCHING_UP):
        if task.state.damaged and task.phase is Phase.LIVE:
            return await rebuild_damaged(task)
        try:
            for lane in task.lanes:
                lane.drop()
            if task.transaction is not None:
                await task.transaction.reset()
                await restore_tail(task)
            if task.next_position is not None and task.phase is Phase.LIVE:
                task.rewind(task.next_position)
            return True
        except FencedError as exc:
            task.mark_lost(exc)
            return False
        except Exception as exc:
            log.error("%s: rewind failed (%r); retrying in %.1fs", task.name, exc, pace.delay)
            await pace.wait()
    return False
