"""Python's cyclic garbage collector, tuned for a worker (setting ``gc_threshold``).

A worker keeps thousands of records alive across awaits (a batch in hand, the next one
fetched ahead), so with Python's default first-generation threshold (700 allocations)
they survive young collections, are promoted, and fill the oldest generation, whose
full collections then walk every object of the process: measured on the orders
projection, 0.9 s of 3.1 s of CPU over 200,000 events went to the collector. A first
generation of 50,000 lets a batch's objects die young (0.26 s). Reference counting frees
everything acyclic at once either way; the threshold only decides how often cycles are
looked for.
"""

from __future__ import annotations

import gc
from collections.abc import Callable


def tune_collector(threshold: int) -> Callable[[], None]:
    """Set the first generation's threshold to ``threshold`` (0: leave the interpreter's)
    and return what puts the previous one back (the worker's stop)."""
    before = gc.get_threshold()
    if threshold <= 0:
        return lambda: None
    gc.set_threshold(threshold, *before[1:])

    def undo() -> None:
        if gc.get_threshold()[0] == threshold:  # not changed by someone else meanwhile
            gc.set_threshold(*before)

    return undo
