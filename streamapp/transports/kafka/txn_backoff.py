"""The wait between two transactions of one writer when the broker is still finishing
the first (aiokafka's ``BACKOFF_OVERRIDE``).

A transaction's commit returns once the coordinator has logged it; the markers are
written after that. A partition task that begins its next transaction at once (a batch
fetched ahead runs right after the commit, :mod:`streamapp.engine.ahead`) can get
``CONCURRENT_TRANSACTIONS`` for its first ``AddPartitionsToTxn``, and aiokafka waits a
fixed 20 ms before it asks again (KAFKA-5477), which made most of a live event's p99.
The markers of a local broker are written within a few milliseconds: asking again every
2 ms costs a small request or two when they are not. Measured (a transaction of eight
partitions and their offsets, back to back, 1,000 of them): 20 ms, p50 25 ms a
transaction; 5 ms, 10-11 ms; 2 ms, 7.1 ms at the same CPU; 1 ms, 6-7 ms at 10% more CPU.
Process-wide (aiokafka keeps it module-level); it changes nothing but that wait.
"""

from __future__ import annotations

import logging

from aiokafka.producer import sender

log = logging.getLogger("streamapp.kafka")

CONCURRENT_TRANSACTIONS_BACKOFF_S = 0.002


def shorten_concurrent_transactions_backoff() -> None:
    """Ask again after :data:`CONCURRENT_TRANSACTIONS_BACKOFF_S` (aiokafka: 20 ms)."""
    current = getattr(sender, "BACKOFF_OVERRIDE", None)
    if not isinstance(current, float):  # another aiokafka: left as it is
        log.debug("aiokafka has no BACKOFF_OVERRIDE: the wait between transactions is its own")
        return
    sender.BACKOFF_OVERRIDE = min(current, CONCURRENT_TRANSACTIONS_BACKOFF_S)
